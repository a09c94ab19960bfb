#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# The layering the build enforces, checked from the sources: includes point down only, the
# include graph has no cycle, and no library source file grows past the size limit.
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', '..')
MAX_LINES = 600

# Each layer and the layers whose headers it may include (its own first).
LAYERS = {
    'src/base': ['src/base'],
    'src/engine': ['src/engine', 'src/base'],
    'src/socket': ['src/socket', 'src/engine', 'src/base'],
    'src/rsocket': ['src/rsocket', 'src/socket', 'src/engine', 'src/base'],
    'preload': ['preload', 'src/socket', 'src/engine', 'src/base'],
}
ORDER = ['src/base', 'src/engine', 'src/socket', 'src/rsocket', 'preload']
# Headers that are no layer's: the generated config.h and the public include/ directory.
NEUTRAL = {'config.h'}

include_re = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
errors = []
headers = {}  # header name -> layer that has it
for layer in ORDER:
    for name in os.listdir(os.path.join(root, layer)):
        if name.endswith('.h'):
            if name in headers:
                errors.append(f'{layer}/{name}: the name is also a header of {headers[name]}')
            headers[name] = layer

graph = {}
for layer in ORDER:
    for name in sorted(os.listdir(os.path.join(root, layer))):
        if not name.endswith(('.h', '.cpp')):
            continue
        path = os.path.join(layer, name)
        with open(os.path.join(root, path), encoding='utf-8') as f:
            lines = f.readlines()
        if len(lines) > MAX_LINES:
            errors.append(f'{path}: {len(lines)} lines (more than {MAX_LINES}: split it by concern)')
        deps = []
        for n, line in enumerate(lines, 1):
            m = include_re.match(line)
            if not m:
                continue
            inc = m.group(1)
            if inc in NEUTRAL or inc.startswith('rstream/'):
                continue
            owner = headers.get(inc)
            if owner is None:
                errors.append(f'{path}:{n}: "{inc}" is no header of the library layers')
            elif owner not in LAYERS[layer]:
                errors.append(f'{path}:{n}: includes {owner}/{inc}, which {layer} may not see')
            else:
                deps.append(f'{owner}/{inc}')
        graph[path] = deps

# Cycles among headers (a .cpp is never included, so only headers can close one).
state = {}
def visit(node, stack):
    state[node] = 1
    stack.append(node)
    for d in graph.get(node, []):
        if state.get(d) == 1:
            errors.append('include cycle: ' + ' -> '.join(stack[stack.index(d):] + [d]))
        elif d not in state:
            visit(d, stack)
    stack.pop()
    state[node] = 2

for node in sorted(graph):
    if node not in state:
        visit(node, [])

for e in errors:
    print(e)
files = len(graph)
if errors:
    print(f'layout: {len(errors)} problem(s) in {files} files')
    sys.exit(1)
print(f'layout: {files} files in {len(ORDER)} layers, includes point down, no cycle, '
      f'none over {MAX_LINES} lines')
