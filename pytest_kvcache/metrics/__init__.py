"""The plugin's metrics: the catalogue that declares each one (:mod:`.catalogue`), and the Prometheus
``/metrics`` scrapes of a server with the values and deltas read from them (:mod:`.prometheus`)."""
