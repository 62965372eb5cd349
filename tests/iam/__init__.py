"""Every AWS call the stack's principals make, checked against the rendered template's IAM.

`recorder` records each botocore call (who made it, with what), `stack_policies` renders
template.yaml as CloudFormation would deploy it, `requests` turns a call into the authorization
requests IAM evaluates for it, and `evaluate` decides each one the way IAM does.
"""
