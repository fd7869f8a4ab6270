"""The server's settings: one table of every setting (``settings``) and where values come from
(``sources``: flags, ``DECODA_*`` environment variables, config/server.yaml)."""
