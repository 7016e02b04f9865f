"""What the bench scripts share and none runs on its own: loopback servers and ports
(loopback), the nginx span sink (span_sink), the lean SSE client (stream_client), the proxy
bench's targets and tables (proxy_report), the machine a run was on (machine), and the
soak's fills and costs (soak_fill, soak_costs), and gpu_check's sections beyond its own: the
run's sizes and the cards' peaks (gpu_common), the speed section (gpu_speed) and the CUDA
graphs section (gpu_graphs).

A script in bench/ puts the repository root on sys.path and imports these as
`bench.lib.<module>`."""
