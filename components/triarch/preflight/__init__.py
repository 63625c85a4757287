"""`triarch preflight`: what an account must have before `pulumi up` creates a stack there, checked read-only with
the deploying credentials. `permissions` holds the IAM actions the program needs (and the policy Triarch ships),
`plan` decides what to check from the validated stack (pure), `aws` asks the account (boto3, read calls only)."""
