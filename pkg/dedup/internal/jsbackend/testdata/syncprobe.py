#!/usr/bin/env python3
"""Counts the syncs of each way TestSyncProbe writes, from its strace.

usage: syncprobe.py STRACE

A sync is an fsync or fdatasync, or an open with O_SYNC (its write syncs).
Each is attributed to what it syncs: the stream's message blocks, its index,
an atomic batch's staging store, a Raft log, a directory, a metadata file.
"""
import collections, re, sys

def kind(path):
    if "/batches/" in path:
        what = "batch-store"
        if path.endswith(".blk"):
            what += " blk"
        elif re.search(r"/batches/[^/]+$", path) or path.endswith(("/batches", "/msgs", "/obs")):
            what += " dir"
        else:
            what += " " + path.rsplit("/", 1)[-1].replace(".tmp", "")
        return what
    if "/_js_/" in path:
        grp = "meta" if "/_meta_/" in path else "stream"
        return "raft-%s %s" % (grp, "wal" if path.endswith(".blk") else path.rsplit("/", 1)[-1].replace(".tmp", ""))
    if path.endswith(".blk"):
        return "stream blk"
    if path.endswith("index.db") or path.endswith("index.db.tmp"):
        return "stream index.db"
    base = path.rsplit("/", 1)[-1]
    if "." not in base:
        return "dir " + base
    return "file " + base.replace(".tmp", "")

def main():
    path = sys.argv[1]
    way = None
    counts = collections.OrderedDict()
    mark = re.compile(r'openat\(AT_FDCWD[^,]*, "/syncprobe/([^"]+)/(begin|end)"')
    sync = re.compile(r'\b(fsync|fdatasync)\((\d+)<([^>]*)>')
    osync = re.compile(r'openat\(AT_FDCWD[^,]*, "([^"]+)", [^)]*O_SYNC')
    servers = {}
    for line in open(path):
        m = mark.search(line)
        if m:
            way = m.group(1) if m.group(2) == "begin" else None
            if way:
                counts[way] = collections.Counter()
            continue
        if way is None:
            continue
        m = sync.search(line)
        if m:
            p = m.group(3)
        else:
            m = osync.search(line)
            if not m:
                continue
            p = m.group(1)
        k = kind(p)
        if "O_SYNC" in line and "openat" in line:
            k += " (O_SYNC)"
        # Which server: the test's store directories differ by temp dir.
        srv = re.search(r"/(\d{3,})/", p)
        counts[way][k] += 1
        if srv:
            servers.setdefault(way, collections.Counter())[srv.group(1)] += 1
    for way, c in counts.items():
        print("%s: %d syncs" % (way, sum(c.values())))
        for k, n in c.most_common():
            print("    %6d  %s" % (n, k))
        if way in servers and len(servers[way]) > 1:
            print("    by store: " + ", ".join("%d" % n for _, n in servers[way].most_common()))

main()
