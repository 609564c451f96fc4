"""The HTTP server: llama-server's endpoints for editors, OpenAI's for chat clients."""
