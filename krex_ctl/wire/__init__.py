"""Every format krex speaks, each owned by one module: the binary frames and the names of the header's enums
(frames), the shim's exported functions through the same cffi FFI (native), the JSON ops (ops), the one
client connection (client), the `krex run` report (report), the runtime files next to a socket and a job's
counters file (runtime), and the warm workers' environment contract (worker).

Nothing here imports the policy, the enforcement mechanisms or the server."""
