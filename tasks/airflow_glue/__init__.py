"""Airflow Connections and DAG runs as plain values: the only imports of airflow outside
dags/ (results DB, SSH keys, Slack clients, dag.test())."""
