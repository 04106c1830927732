export EXITWATCH_WATCHDOG_DIR=/tmp/dw31/sp/watchdogs PYTHONPATH=/work/wt/docs31
EW="/usr/bin/python3 -m exitwatch"
$EW watchdog --pid 5907 --timeout 2; echo rc=$?
$EW watchdog --pid 5907 --pet; echo rc=$?
$EW while-alive --cancel 0123456789abcdef0123456789abcdef; echo rc=$?
$EW while-alive --cancel xyz; echo rc=$?
$EW while-alive --every 0.5 -- true; echo rc=$?
EXITWATCH_WATCHDOG_DIR=/nonexistent/wd $EW watchdog --timeout 5; echo rc=$?
# by hand: a watchdog file naming root's process
/usr/bin/python3 - <<'PY'
import os, time
from exitwatch.owner import owner_of
from exitwatch.alive import watchdog_id
from exitwatch.contract import add_entry
import json
o = owner_of(5907)
data = json.dumps({"owner": str(o), "timeout": 1.0, "grace": 1.0, "created": time.time(), "reason": "by hand"}).encode()
add_entry("/tmp/dw31/sp/watchdogs", watchdog_id(o), "watchdog.json", data)
print("written")
PY
