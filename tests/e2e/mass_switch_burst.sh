#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# mass_switch.sh with all 500 connections made first and then switching at once (see there).
E2E_MASS_SWITCH_BURST=1 exec "$(dirname "$0")/mass_switch.sh" "$@"
