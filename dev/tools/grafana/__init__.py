"""The Grafana dashboards' sources, rendered by ``dev/tools/dashboards.py``.

- :mod:`dev.tools.grafana.panels`: the :class:`~dev.tools.grafana.panels.Panel` model and the
  PromQL target builders (:func:`~dev.tools.grafana.panels.by`, ``errs``, ``total``, ...);
- :mod:`dev.tools.grafana.render`: a panel list laid out and rendered as dashboard JSON;
- :mod:`dev.tools.grafana.boards`: the three dashboards' panel lists (``DASHBOARDS``).
"""
