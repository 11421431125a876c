"""One module per asset; each stays thin: config and resources in, pure functions, metadata out."""
