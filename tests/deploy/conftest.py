"""tests/deploy: what users deploy with, tested as they deploy it (marker ``deploy``).

- Here, in ``make test``: the Helm chart rendered, linted and validated offline
  (``test_chart_*.py``), deploy/docker's Compose file and Dockerfiles without an engine
  (``test_deploy_docker.py``), deploy/prometheus's rules under promtool (``test_deploy_rules.py``)
  and every dashboard query against a real Prometheus scraping a live stack
  (``test_deploy_live.py``); the pinned tools come from dev/tools/install.sh (the ``tools``
  fixture).
- ``containers/``: kdelay's images on a container engine (``make test-containers``).
- ``k8s/``: the chart on a real single-node Kubernetes (``make test-k8s``).

Each subfolder runs only when its target asks for it and is deselected from every other run.
``make test-deploy`` runs the whole tier as ``make test`` does (the subfolders deselected).
"""
