"""One module per enforcement mechanism, each a small interface the server calls with the policy's effects:
gate (the shared gate page), freeze (SIGSTOP/SIGCONT with a durable record and the resumer), isolate (CPU
affinity), attest (the GPU's own counters). Nothing here imports the policy or the server."""
