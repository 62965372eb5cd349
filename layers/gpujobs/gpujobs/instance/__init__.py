"""What runs on a training instance: the user data the launcher renders and the fixed bootstrap program.

`userdata` is imported by the launch Lambda; `bootstrap` runs on the instance (stdlib + boto3 only).
"""
