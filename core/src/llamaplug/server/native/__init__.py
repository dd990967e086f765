"""llama-server's own API: /completion, /infill, /tokenize, /detokenize, /apply-template, /props, /slots,
/rerank, with llama-server's error shape."""
