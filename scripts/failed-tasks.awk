# Print the tasks that failed in an Ansible/molecule log, each with its play, task header and result.
# `make molecule` runs it when a scenario fails: CI keeps only the tail of a long log, where molecule's
# destroy output would otherwise hide why the scenario failed. Failures Ansible ignored are left out.
# Usage: awk -f scripts/failed-tasks.awk LOG
function emit() {
    if (block != "") { print block "\n"; found++ }
    block = ""
}
# A finished block is printed when the next non-blank line shows it was not ignored.
pending && /^\.\.\.ignoring/ { block = ""; pending = 0; next }
pending && !/^$/ { emit(); pending = 0 }
/^PLAY \[/ { play = $0 }
/^TASK \[/ { task = $0 }
/^(fatal|failed): \[/ {
    if (collecting) emit()
    block = play "\n" task "\n" $0
    lines = 1
    collecting = 1
    next
}
collecting && /^\.\.\.ignoring/ { block = ""; collecting = 0; next }
collecting && (/^$/ || /^(TASK|PLAY|RUNNING HANDLER) \[/ || /^(ok|changed|skipping): \[/) {
    collecting = 0
    pending = 1
    if (!/^$/) { emit(); pending = 0 }
    next
}
collecting {
    if (lines < 80) block = block "\n" $0
    lines++
}
END {
    emit()
    if (!found) print "(no failed task in the log: molecule itself failed, see its messages above)"
}
