#!/usr/bin/env bash
# docs/config.md is what `memtrain train --keys-markdown` prints from the
# table of keys (include/memtrain/config/keys.def).
#   bash tests/structure/config_doc.sh MEMTRAIN DOCS_CONFIG_MD
set -euo pipefail
memtrain=$1
doc=$2
if ! "$memtrain" train --keys-markdown | diff -u "$doc" -; then
  echo "config_doc: $doc differs from the table of keys (above: - the" \
    "committed file, + the table's); regenerate it with" \
    "'memtrain train --keys-markdown > docs/config.md'" >&2
  exit 1
fi
echo "config_doc: $doc is the table's ($(grep -c '^| `' "$doc") keys)"
