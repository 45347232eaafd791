"""krex controller side: CLI, per-node controller daemon, protocol and the `krex run` wrapper."""

__version__ = "0.1.0"
