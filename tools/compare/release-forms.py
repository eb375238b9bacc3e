#!/usr/bin/env python3
"""Redis' instructions per release script form, independent of the machine's load.

For each form, one redis-server runs under valgrind (cachegrind, no cache simulation) and is
sent N and then (on a fresh server) 3N pairs of `SET lock value NX PX` + the release call, by
`redis-cli --pipe`; the difference divided by 2N is the instructions per pair, start-up and the
script's load cancelled out. The forms are: the floor's compare-and-delete, quorumlock's release before it
named only what each node needs, the shipped release in each of its forms (lean, full with the
counter below and at the token, bare), the floor's script given a second key it never reads, and
a waiters flag read with MGET in place of SCARD.

    tools/compare/release-forms.py [N] [FORM ...]

Needs valgrind, redis-server and redis-cli on PATH.
"""
import os
import subprocess
import sys
import tempfile
import time

FLOOR = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"

BEFORE = """local t = tonumber(ARGV[2])
if t > 0 and tonumber(redis.call('GET', KEYS[2]) or '0') < t then
  redis.call('SET', KEYS[2], ARGV[2])
end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if KEYS[3] then
    local n = redis.call('SCARD', KEYS[3])
    if n > 0 then
      redis.call('PUBLISH', KEYS[3], ARGV[1] .. ' ' .. n)
    end
  end
  return 1
end
if v == false then
  return 0
end
return -1"""

# The release as it ships, read from the crate's one place for its Lua (not a copy that
# could drift from it).
LUA_RS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "node", "lua.rs")


def shipped(name):
    with open(LUA_RS) as f:
        text = f.read()
    body = text.index('r#"', text.index(f"pub(crate) static {name}:")) + len('r#"')
    return text[body:text.index('"#', body)].strip()


AFTER = shipped("RELEASE")

# A string flag beside the waiters set, read with the lock key in one MGET: SCARD only when set.
FLAG = """local r = redis.call('MGET', KEYS[1], KEYS[2])
local v = r[1]
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if r[2] then
    local n = redis.call('SCARD', KEYS[3])
    if n > 0 then
      redis.call('PUBLISH', KEYS[3], ARGV[1] .. ' ' .. n)
    end
  end
  return 1
end
if v == false then
  return 0
end
return -1"""

FENCE = "quorumlock:fence:{A}"
FORMS = {
    "set+del": (None, None),
    "floor": (FLOOR, lambda k, v: [1, k, v]),
    "before-lean": (BEFORE, lambda k, v: [3, k, FENCE, k + ":waiters", v, 0]),
    "before-full": (BEFORE, lambda k, v: [3, k, FENCE, k + ":waiters", v, 5]),
    "after-lean": (AFTER, lambda k, v: [2, k, k + ":waiters", v]),
    "after-full": (AFTER, lambda k, v: [3, k, k + ":waiters", FENCE, v, 5]),
    # The counter checked where it stands at the token (the usual case: the node's INCR gave it).
    "after-full-at-token": (AFTER, lambda k, v: [3, k, k + ":waiters", FENCE, v, 10**9]),
    "after-bare": (AFTER, lambda k, v: [1, k, v]),
    # The floor's script given a second key it never reads: what passing a key costs.
    "floor-2keys": (FLOOR, lambda k, v: [2, k, k + ":waiters", v]),
    "flag-mget": (FLAG, lambda k, v: [3, k, k + ":waiting", k + ":waiters", v]),
}


def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def cli(port, *args):
    return subprocess.run(
        ["redis-cli", "-p", str(port)] + [str(a) for a in args], capture_output=True, text=True
    ).stdout


def irefs(work, form, pairs, port=7399):
    code, call = FORMS[form]
    out = os.path.join(work, "cg.out")
    server = subprocess.Popen(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=" + out,
         "redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        if "PONG" in cli(port, "PING"):
            break
        time.sleep(0.1)
    buf = bytearray()
    sha = cli(port, "SCRIPT", "LOAD", code).strip() if code else None
    cli(port, "SET", FENCE, 10**9)
    for i in range(pairs):
        key, value = "quorumlock:{k%d}" % (i % 64), "%032x" % i
        buf += resp("SET", key, value, "NX", "PX", 30000)
        buf += resp("EVALSHA", sha, *call(key, value)) if code else resp("DEL", key)
    feed = os.path.join(work, "in.resp")
    with open(feed, "wb") as f:
        f.write(buf)
    with open(feed, "rb") as f:
        subprocess.run(["redis-cli", "-p", str(port), "--pipe"], stdin=f,
                       stdout=subprocess.DEVNULL, check=True)
    cli(port, "SHUTDOWN", "NOSAVE")
    server.wait()
    with open(out) as f:
        return next(int(l.split()[1]) for l in f if l.startswith("summary:"))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    forms = sys.argv[2:] or list(FORMS)
    with tempfile.TemporaryDirectory() as work:
        for form in forms:
            per = (irefs(work, form, 3 * n) - irefs(work, form, n)) / (2 * n)
            print(f"{form}: {per / 1000:.1f}k instructions per SET + release pair", flush=True)


if __name__ == "__main__":
    main()
