"""The harness side of class plug-ins (docs/contract.md §11): a user's class driven
by our code and checked on the way."""
