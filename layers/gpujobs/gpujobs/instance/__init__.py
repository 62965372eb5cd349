"""What runs on a training instance, and the user data that carries it there.

Every module here but `userdata` is the bootstrap, which runs on the instance: `userdata` (imported by
the launch Lambda) bundles them into the user data, so they import only the stdlib, each other and,
late, boto3, and parse on Python 3.9. `bootstrap` is the program (`python -m gpujobs.instance.bootstrap`);
`contract` holds its copy of the names it shares with the control plane. See docs/instance.md.
"""
