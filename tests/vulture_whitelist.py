"""What vulture cannot see used in the product (tests/test_dead_code.py): each group says who uses it."""

# ruff: noqa: B018
from bot import cli, longconn
from memory_core import dream_light, forgetting, ops, rawindex, recall, store, textindex, vault
from workers import feishu_send, mailbox, scheduler, turn, worker

# Registered by @command and run through cli.COMMANDS.
cli.cmd_remember, cli.cmd_forget, cli.cmd_erase, cli.cmd_pin, cli.cmd_show, cli.cmd_history
cli.cmd_undo, cli.cmd_import, cli.cmd_recall, cli.cmd_search, cli.cmd_dream
# Overrides of what the lark-oapi SDK calls.
longconn._Client._get_conn_url, longconn._Events._do_without_validation
# Named in a string: the git-filter-repo script of workers/erasure.py imports it.
forgetting.purge_blob
# Values `Kind(status)` accepts; an Outcome is built from the string.
ops.Kind.UNCHANGED, ops.Kind.RECORDED, ops.Kind.PURGED
# Turn jobs queued by its old name before the upgrade that moved the turn job (docs/ARCHITECTURE.md).
turn.handle_message
# rq's CronJob swapped for ours at registration (workers/scheduler.py).
scheduler.JSONCronJob.__class__
# Set as rq's own `subscribe` sets it; read by rq's `Worker.unsubscribe` (workers/worker.py).
worker.Worker.pubsub_thread
# Read only by tests and bench/, which vulture is not given.
dream_light.LightResult.skipped, rawindex.RawIndex.embed_pending, recall.fuse, store.Store.read_vault
textindex.entry_relevance, vault.unseal, feishu_send.Pacer.reserve, mailbox.Intake.accept
