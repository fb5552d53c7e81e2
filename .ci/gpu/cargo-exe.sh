# Sourced by the *-build.sh scripts of .ci/gpu/ (not run on its own), from the repository
# root.
#
# exe_of NAME: the executable of cargo target NAME (a test, bench or example) in cargo's JSON
# messages (`--message-format=json`) on stdin; the last one when several artifacts name it.
exe_of() {
    python3 -c '
import json, sys
name = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == name \
            and m.get("executable"):
        print(m["executable"])
' "$1" | tail -n 1
}
