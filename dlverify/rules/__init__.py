"""Rule-set research: run another rule set (`--rules DIR`), count what each rule derives
(`dlverify rules stats`) and fuzz every View rule numerically (`dlverify rules check`)."""
