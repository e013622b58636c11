# layerbank: the API, workers and Ray nodes all run this one image (docker-compose.yml).
#
#   docker build -t layerbank .                                   # CUDA torch (GPU nodes)
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu -t layerbank .
#
# torch goes in first and pinned, as scripts/install.sh does: the project pins
# torch==2.13.0, and installing it up front decides which build (CUDA or CPU)
# the image gets instead of leaving that to the resolver.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HDF5_USE_FILE_LOCKING=FALSE

ARG TORCH_INDEX_URL=""
RUN pip install "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}

WORKDIR /opt/layerbank
COPY pyproject.toml README.md ./
COPY app ./app
COPY cache ./cache
COPY workers ./workers
# the Ray extra is in every image: the same image serves as API host and Ray node,
# and Ray needs the same version of itself (and of layerbank) on every node; psycopg
# (the postgres extra) for the replicas profile's PostgreSQL catalog
RUN pip install ".[ray,postgres]"

RUN useradd --create-home --uid 1000 layerbank && mkdir -p /data && chown layerbank /data
USER layerbank
ENV LAYERBANK_DATA_DIR=/data
VOLUME ["/data"]
EXPOSE 8000
CMD ["layerbank", "serve", "--host", "0.0.0.0", "--port", "8000"]
