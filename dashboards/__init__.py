"""gpuscope's Grafana dashboards: the generator (`build`, a module per dashboard on the panel layer
in `panels`, `layout` and `queries`), PromQL helpers for checking them (`promql`), a live stack of
simulated daemons and a real Prometheus (`live`), and the picture renderer (`render`: each
panel type drawn by `draw`, laid out and checked for texts out of place by `fit`). The
dashboards themselves are the `*.json` files beside this module."""
