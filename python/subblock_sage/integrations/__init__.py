"""Drop-in adapters for serving stacks (``subblock_sage.integrations.sglang``: SGLang's SubBlock
sparse-attention backend). Each adapter imports only subblock_sage and torch, never the stack."""
