# Airflow with perfpipe's exact pins (requirements.txt pins apache-airflow itself, so the
# image's Airflow and the pipeline's match). The repo is mounted at /opt/perfpipe.
FROM apache/airflow:3.3.2-python3.11
USER root
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
USER airflow
COPY requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir -r /tmp/requirements.txt
