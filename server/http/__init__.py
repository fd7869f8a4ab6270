"""What every route shares, whatever API it serves: errors in OpenAI's shape, API keys, request
limits, request ids and access logs, Prometheus metrics and the response counter."""
