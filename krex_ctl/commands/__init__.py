"""One module per `krex` subcommand."""
