"""The `gpujobs` command line: submit, watch, list and cancel jobs, and check specs offline.

It lives beside the Lambda layer, not in it: no function imports it, so `sam build` ships none of
it. It imports the layer's domain and adapters (one spec model, one job id rule, one table reader),
never the local cloud, which plugs in `gpujobs local` through an entry point (see main.py).
"""
