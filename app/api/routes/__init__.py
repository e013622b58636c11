"""The ``/v1`` routes and the operational endpoints, one router per resource.

May import ``layerbank.app.api`` and ``layerbank.cache``; never torch.
"""
