"""Replaying real spot capacity traces at simulated time: the goodput benchmark (`bench/goodput.py`).

`traces` reads the trace folders, `model` holds the workload, its time costs, prices and the score,
`anchors` models the strategies of the anchors (SkyPilot, SageMaker, on-demand, Uniform Progress),
`control_plane` runs the real gpujobs service layer against the traces, and `suite` runs them all.
"""
