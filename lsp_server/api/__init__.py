"""The server's handlers, one module per LSP request, notification or command (ruff_server's server/api is the
model). Each module names its method (METHOD, or COMMAND for workspace/executeCommand) and its `handle`; router.py
registers them all on the pygls server. Handlers read and change the server's state through its parts
(lsp_server/server.py), never keep any of their own."""
