# ptctl's images (see docker-compose.yml):
#   docker build -t ptctl-api    --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu   .  # api, ray-head, mlflow
#   docker build -t ptctl-worker --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .  # GPU ray-worker
# The CUDA runtime comes with the cu128 torch wheel; the host needs the NVIDIA driver and the
# NVIDIA container toolkit (compose reserves the GPUs). Every image holds the same ptctl code and
# the same Ray and Python versions, which a Ray cluster requires.
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PTCTL_DATA_DIR=/data \
    RAY_USAGE_STATS_ENABLED=0

# torch first: the largest layer, rebuilt only when TORCH_INDEX changes (pinned as in pyproject.toml)
RUN pip install --index-url "${TORCH_INDEX}" "torch==2.13.0"

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY analysis ./analysis
COPY studies ./studies
COPY workers ./workers
COPY service ./service
# editable: the Alembic migrations under service/migrations are read from the source tree;
# mup declares torchvision but never imports it (see Makefile), hence --no-deps
RUN pip install -e . \
 && pip install --no-deps "mup==1.0.0" \
 && useradd --create-home --uid 1000 ptctl \
 && mkdir -p /data /mlartifacts \
 && chown ptctl:ptctl /data /mlartifacts

USER ptctl
VOLUME ["/data"]
EXPOSE 8000
CMD ["ptctl", "serve", "--host=0.0.0.0", "--port=8000"]
