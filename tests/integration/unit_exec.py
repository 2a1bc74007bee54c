#!/usr/bin/env python3
"""unit_exec.py — a systemd unit's command line as systemd would run it (test_systemd.sh).

    unit_exec.py UNIT INSTANCE KEY ROOT  -> the argv of the unit's KEY= (ExecStart, ExecReload),
                                            one word per line

Done as systemd.service(5) and systemd.exec(5) say: Environment= first, then every
EnvironmentFile= in order (later ones override; "-" prefix: optional), specifiers %i %I %n %%,
then "${VAR}" is replaced by the value as one word and "$VAR" as a word of its own is split at
whitespace (zero or more words); an unset variable is empty. Files named by the unit under /etc
are read from ROOT/etc, so a test can put its env files in a directory of its own. Only what the
shipped units use is implemented; anything else (quotes, a second ExecStart) is refused, so the
test fails instead of checking something systemd would do differently.
"""
import os
import re
import shlex
import sys


def fail(msg):
    sys.stderr.write("unit_exec.py: %s\n" % msg)
    sys.exit(2)


def read_unit(path):
    keys = []
    for raw in open(path, encoding="utf-8"):
        line = raw.strip()
        if not line or line[0] in "#;" or line.startswith("["):
            continue
        if "=" not in line:
            fail("%s: no '=' in %r" % (path, line))
        k, v = line.split("=", 1)
        keys.append((k.strip(), v.strip()))
    return keys


def specifiers(s, instance, unit):
    out = {"i": instance, "I": instance, "n": unit, "%": "%"}
    return re.sub(r"%(.)", lambda m: out[m.group(1)] if m.group(1) in out else
                  fail("specifier %%%s not implemented" % m.group(1)), s)


def env_file(path, env):
    for raw in open(path, encoding="utf-8"):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        k, _, v = line.partition("=")
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
            v = v[1:-1]
        env[k.strip()] = v


def main():
    if len(sys.argv) != 5:
        fail("usage: unit_exec.py UNIT INSTANCE KEY ROOT")
    path, instance, key, root = sys.argv[1:]
    unit = path.rsplit("/", 1)[-1].replace("@.", "@%s." % instance)
    keys = read_unit(path)
    env = {}
    for k, v in keys:
        if k == "Environment":
            for word in shlex.split(specifiers(v, instance, unit)):
                name, _, val = word.partition("=")
                env[name] = val
    for k, v in keys:
        if k == "EnvironmentFile":
            optional = v.startswith("-")
            f = specifiers(v.lstrip("-"), instance, unit)
            try:
                env_file(root + f if f.startswith("/etc/") else f, env)
            except FileNotFoundError:
                if not optional:
                    fail("EnvironmentFile %s does not exist (systemd would not start the unit)" % f)
    # what systemd itself sets for ExecReload= and the like (the test passes the pid)
    if "MAINPID" in os.environ:
        env["MAINPID"] = os.environ["MAINPID"]
    lines = [v for k, v in keys if k == key]
    if len(lines) != 1:
        fail("%s: %d %s= lines, expected 1" % (path, len(lines), key))
    cmd = specifiers(lines[0], instance, unit)
    if any(q in cmd for q in "\"'\\"):
        fail("quoting in %s= is not implemented" % key)
    argv = []
    for word in cmd.split():
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:
            argv.extend(env.get(m.group(1), "").split())
            continue
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda x: env.get(x.group(1), ""),
                           word))
    print("\n".join(argv))


main()
