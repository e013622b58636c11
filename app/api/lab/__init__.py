"""The probe lab: web pages served by ``layerbank serve`` from files in this package.

Imports only Starlette and the standard library; the pages are one more client
of the public ``/v1`` API (they call it from the browser), never a second back end.
"""

from layerbank.app.api.lab.pages import LAB_PAGES, LabPages

__all__ = ["LAB_PAGES", "LabPages"]
