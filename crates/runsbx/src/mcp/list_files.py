# list_files, run inside the sandbox as `python3 - PATH DEPTH BUDGET` (this
# file on stdin). Prints one JSON object: {"path", "entries": [{"path",
# "type", "size"}], "truncated"} or {"error"}. Never follows a symbolic
# link; stops before its output passes BUDGET bytes, so that runsbx's
# capture never cuts the JSON.
import json
import os
import stat
import sys

root, depth, budget = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def text(p):
    # A name that is not UTF-8 keeps its bytes as \xNN escapes.
    return os.fsencode(p).decode("utf-8", "backslashreplace")


def kind(mode):
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


try:
    top = os.lstat(root)
except OSError as e:
    print(json.dumps({"error": f"{text(root)}: {e.strerror}"}))
    sys.exit(0)

out = {"path": text(os.path.abspath(root)), "entries": [], "truncated": False}
used = len(json.dumps(out))
if not stat.S_ISDIR(top.st_mode):
    out["entries"].append({"path": text(os.path.basename(root)), "type": kind(top.st_mode), "size": top.st_size})
    print(json.dumps(out))
    sys.exit(0)


def walk(rel, level):
    """Adds the entries under `rel`, each directory followed by its own;
    False once the budget is spent."""
    global used
    try:
        with os.scandir(os.path.join(root, rel)) as it:
            names = sorted(e.name for e in it)
    except OSError:
        return True
    for name in names:
        child = os.path.join(rel, name)
        try:
            st = os.lstat(os.path.join(root, child))
        except OSError:
            continue
        entry = {"path": text(child), "type": kind(st.st_mode), "size": st.st_size}
        cost = len(json.dumps(entry)) + 2
        if used + cost > budget:
            out["truncated"] = True
            return False
        used += cost
        out["entries"].append(entry)
        if stat.S_ISDIR(st.st_mode) and level < depth and not walk(child, level + 1):
            return False
    return True


walk("", 1)
print(json.dumps(out))
