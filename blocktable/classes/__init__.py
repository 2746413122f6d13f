"""Our own classes seen through docs/contract.md §11's class protocols, so that the
lockstep's class path (`--pool ours`) runs the same code a user's class would."""
