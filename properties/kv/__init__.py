"""One KV call at a time (docs/contract.md §9): as case-file data, behind guards,
compared whole with the truth, decoded, drawn and shrunk; the KV data itself."""
