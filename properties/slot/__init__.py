"""One slot-mapping call at a time (docs/contract.md §4): as case-file data, behind
guards, compared whole with the truth, decoded, drawn and shrunk."""
