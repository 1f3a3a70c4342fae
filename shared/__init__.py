"""Code used by more than one service: config, domain types, protocol
conversions, logging, the client SDK and the CLI."""
