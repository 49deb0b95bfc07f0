"""The Grafana dashboards' sources, rendered by ``dev/tools/dashboards.py``.

- :mod:`dev.tools.grafana.panels`: the :class:`~dev.tools.grafana.panels.Panel` model and the
  PromQL target builders (:func:`~dev.tools.grafana.panels.by`, ``errs``, ``total``, ...);
- :mod:`dev.tools.grafana.render`: a panel list built into a dashboard with Grafana's own SDK
  (grafana-foundation-sdk), and its JSON;
- :mod:`dev.tools.grafana.boards`: the three dashboards' panel lists (``DASHBOARDS``).
"""
