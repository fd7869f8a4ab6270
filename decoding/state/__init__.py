"""What the worker keeps per request (its rows, prompt, clocks) and per engine (the context every
strategy shares). Below the strategies, which read and write it, and above sampling and text, which
each row uses."""
