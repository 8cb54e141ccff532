"""Loading models from their files without torch: GGUF headers, model configs and tokenizers."""
