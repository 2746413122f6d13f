"""The class path's mutants (docs/contract.md §11): bugs of a team's pool or table
class, planted in our own pool or tables and run through the class path (`--pool
ours`, `--table ours`, `--table-v2 ours`), so that the protocol adapter, the driven sequences and every
comparison after a step are what must catch them. Each imitates a bug such classes
have had."""

from __future__ import annotations

from blocktable.properties.mutation.mutant import Mutant

POOL = "blocktable/pool.py"
PREFIX = "blocktable/prefix.py"
PROTOCOL = "blocktable/classes/pool.py"
OURS = {"pool": "ours"}
AIMED_AT_ADMISSIONS = {"BLOCKTABLE_PREFIX_WORLDS": "fresh-groups", "BLOCKTABLE_KV_WORLDS": "0"}
TABLE = "blocktable/table.py"
TABLE_PROTOCOL = "blocktable/classes/table.py"
OUR_TABLE = {"table": "ours"}
V2_PROTOCOL = "blocktable/classes/table_v2.py"
OUR_V2 = {"table-v2": "ours"}

CLASS_MUTANTS: tuple[Mutant, ...] = (
    Mutant("C01", "classes", POOL,
           "        if (counts > 1).any():",
           "        if False:",
           "a pool class whose free queues a block listed twice in one call twice (vLLM #42571)", classes=OURS),
    Mutant("C02", "classes", POOL,
           "            if hash_of[b] is not None:\n                self._evict(b)\n",
           "",
           "a pool class that hands out a cached block and keeps it under its key (vLLM #4764)", classes=OURS),
    Mutant("C03", "classes", PREFIX,
           "    for seqs in groups:\n        seqs.add(seq, L, array[:L], computed=L)\n    for seqs in groups:\n"
           "        seqs.append(seq, slots - L, array[L:slots])\n",
           "    for seqs in groups:\n        seqs.add(seq, L, array[:L], computed=L)\n"
           "        seqs.append(seq, slots - L, array[L:slots])\n",
           "an admission that allocates one group's fresh blocks before it touches the next group's hits: "
           "the allocation evicts a hit it counted on (vLLM #11565, across groups)", classes=OURS,
           # Aimed at §8's admissions across groups: every world caches prefixes, admits with
           # fresh blocks and has two or more groups.
           env=AIMED_AT_ADMISSIONS),
    Mutant("C04", "classes", POOL,
           "        self._next[before], self._prev[after] = after, before\n        self._size -= 1\n",
           "        self._next[before], self._prev[after] = after, before\n",
           "a pool class whose free count misses a block revived by a hit (free count corrupted)", classes=OURS),
    Mutant("C05", "classes", POOL,
           "            at = (self._head + np.arange(released.size)) % len(self._ring)",
           "            at = (self._head + np.arange(released.size)[::-1]) % len(self._ring)",
           "a pool class that claims vLLM's free order but pushes blocks to the head one by one (reversed)",
           classes=OURS),
    Mutant("C06", "classes", POOL,
           "        if self._size != self.num_usable:\n            return False\n",
           "",
           "a pool class that resets the prefix cache while blocks are in use", classes=OURS),
    Mutant("C07", "classes", PROTOCOL,
           "        if held:\n            self._pool.share(held)\n",
           "",
           "a pool class whose touch revives free blocks but does not count another holder of a block in use "
           "(a fork's shared blocks freed under the parent)", classes=OURS),
    Mutant("C08", "classes", POOL,
           "        for b in blocks[self.ref[blocks] == 0].tolist():\n            self._unlink(b)\n",
           "",
           "a pool class whose touch leaves a revived block in the free queue: it is handed out while in use",
           classes=OURS),
    Mutant("C09", "classes", TABLE,
           "        if have + kernel.size > self.width:\n",
           "        if have + kernel.size > self.width:\n            self.count[r] = self.width\n",
           "a table class whose row count is corrupted before the overflow error is raised", classes=OUR_TABLE),
    Mutant("C10", "classes", TABLE,
           "        if src == dst:\n            return\n",
           "",
           "a table class whose move_row(a, a) copies the row onto itself and then clears it", classes=OUR_TABLE),
    Mutant("C11", "classes", TABLE,
           "        self.host[[a, b]] = self.host[[b, a]]\n",
           "        self.host[a], self.host[b] = self.host[b], self.host[a]\n",
           "a table class that swaps rows through numpy views: both rows end up holding b's", classes=OUR_TABLE),
    Mutant("C12", "classes", TABLE_PROTOCOL,
           "            rank = self._rank if table.cp_world_size > 1 else 0\n",
           "            rank = 0\n",
           "a table class that never hands its DCP rank to the slot kernel: every rank computes rank 0's slots",
           classes=OUR_TABLE),
    Mutant("C13", "classes", TABLE_PROTOCOL,
           "        self._groups.commit(num_reqs)\n",
           "        self._groups.commit(num_reqs - 1 if 1 < num_reqs <= self._groups[0].max_num_reqs else num_reqs)\n",
           "a table class whose commit_block_table leaves the last scheduled row's device copy stale",
           classes=OUR_TABLE),
    Mutant("C14", "classes", V2_PROTOCOL,
           "        self._tables.append_block_ids(r, new_block_ids, overwrite)\n",
           "        self._tables.append_block_ids(r, new_block_ids, False)\n",
           "a V2 table class that drops the overwrite flag: a replaced row's blocks are appended after the old ones",
           classes=OUR_V2),
    Mutant("C15", "classes", V2_PROTOCOL,
           "        return self._tables.gather_block_tables(idx_mapping, num_reqs_padded)\n",
           "        return tuple(t.clone() for t in self._tables.gather_block_tables(idx_mapping, num_reqs_padded))\n",
           "a V2 table class whose gather returns copies, not the persistent input tables a captured graph reads",
           classes=OUR_V2),
)
