"""integrations — epmoe inside other engines' models. Each submodule imports its engine
lazily, so `import epmoe` never needs it: `epmoe.integrations.transformers` (Hugging Face
transformers' DeepSeek V4)."""
