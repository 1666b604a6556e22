# One image for every power-aware-scheduler process: the extender (python -m extender), the
# energy adapter (python -m controllers.energy_adapter), the node power controller
# (python -m controllers.node_power) and the trainer CronJob
# (python -m training.collect / fit / publish).
#   docker build -t power-aware-scheduler:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The package is installed in place (editable) from /app: the service finds its shipped
# bundle at <repo>/models/default, so code and models/ must sit side by side.
COPY pyproject.toml README.md ./
COPY livedata/ livedata/
COPY training/ training/
COPY predictor/ predictor/
COPY extender/ extender/
COPY controllers/ controllers/
RUN pip install --editable . \
    && python -c "import controllers, extender, livedata, predictor, training"
COPY models/ models/

# A fixed numeric non-root user, so that runAsNonRoot can verify it without a passwd lookup.
RUN groupadd --system --gid 10001 pas \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin pas
USER 10001:10001

EXPOSE 8888
CMD ["python", "-m", "extender", "--host", "0.0.0.0"]
