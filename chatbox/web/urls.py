"""The one table of the UI's URLs: templates (as the global `urls`) and handlers build paths here.

One function per route, named after its handler (so a move to Litestar's `url_for` stays
mechanical). Path segments are percent-encoded; the ids the app makes pass through unchanged.
Changing a route's path means changing its handler and its line here, and nothing else.
"""

from __future__ import annotations

from urllib.parse import quote


def _seg(value: object) -> str:
    """One path segment, percent-encoded (a '/' in it cannot reach another route)."""
    return quote(str(value), safe="")


def _conv(conv_id: str) -> str:
    return f"/ui/c/{_seg(conv_id)}"


def _turn(conv_id: str, turn_id: str) -> str:
    return f"{_conv(conv_id)}/turns/{_seg(turn_id)}"


# -- pages -------------------------------------------------------------------------------


def home() -> str:
    """The start page: a new chat."""
    return "/"


def new_chat_in(ws_id: str) -> str:
    """A new chat that starts in a workspace."""
    return f"/?workspace={quote(ws_id, safe='')}"


def conversation(conv_id: str, *, turn: str | None = None, q: str | None = None) -> str:
    """A conversation's page; with `turn`, scrolled to that turn (and `q` highlighted there)."""
    url = f"/c/{_seg(conv_id)}"
    if turn is None:
        return url
    query = f"?turn={quote(turn, safe='')}"
    if q:
        query += f"&q={quote(q, safe='/')}"  # as Jinja's `urlencode` filter quotes
    return f"{url}{query}#turn-{quote(turn, safe='')}"


def memory() -> str:
    return "/memory"


def library() -> str:
    return "/library"


def admin_usage() -> str:
    return "/admin/usage"


def login(next_path: str | None = None) -> str:
    """The login page; `next_path` is where to go after (the start page when omitted)."""
    page = "/login"
    if not next_path or next_path in (home(), page):
        return page
    return f"{page}?next={quote(next_path)}"


def logout() -> str:
    return "/logout"


def static(path: str) -> str:
    """A file under static/ (e.g. "app.css", "vendor/htmx.min.js")."""
    return f"/static/{quote(path.lstrip('/'))}"


# -- a conversation's partials (htmx) ----------------------------------------------------


def send_new() -> str:
    """The first message of a new chat (creates the conversation)."""
    return "/ui/new/send"


def loading() -> str:
    """JSON: models loading now, with the sends waiting for each."""
    return "/ui/loading"


def send(conv_id: str) -> str:
    return f"{_conv(conv_id)}/send"


def stop(conv_id: str) -> str:
    return f"{_conv(conv_id)}/stop"


def stream(conv_id: str, turn_id: str) -> str:
    """The SSE behind a streaming answer."""
    return f"{_turn(conv_id, turn_id)}/stream"


def turn(conv_id: str, turn_id: str) -> str:
    return _turn(conv_id, turn_id)


def edit(conv_id: str, turn_id: str) -> str:
    """GET: the edit form; POST: send the edited message as a new version."""
    return f"{_turn(conv_id, turn_id)}/edit"


def regenerate(conv_id: str, turn_id: str) -> str:
    return f"{_turn(conv_id, turn_id)}/regenerate"


def sources(conv_id: str, turn_id: str) -> str:
    """The passages an answer cited."""
    return f"{_turn(conv_id, turn_id)}/sources"


def branch(conv_id: str) -> str:
    return f"{_conv(conv_id)}/branch"


def settings(conv_id: str) -> str:
    """Title, system prompt and model of a conversation."""
    return f"{_conv(conv_id)}/settings"


def delete(conv_id: str, *, sidebar: bool = False) -> str:
    """GET: the delete dialog (it asks about the share links; `sidebar`: asked from the
    sidebar's menu); POST: delete."""
    return f"{_conv(conv_id)}/delete" + ("?where=sidebar" if sidebar else "")


def shares(conv_id: str) -> str:
    """The chat's share panel: GET lists its links, POST makes a new one."""
    return f"{_conv(conv_id)}/shares"


def revoke_share(conv_id: str, share_id: str) -> str:
    return f"{shares(conv_id)}/{_seg(share_id)}/revoke"


def move(conv_id: str) -> str:
    """POST: move the conversation into a workspace (or back to personal)."""
    return f"{_conv(conv_id)}/workspace"


def attach_new() -> str:
    """A document attached before the first message (creates the conversation)."""
    return "/ui/new/documents"


def attach(conv_id: str) -> str:
    return f"{_conv(conv_id)}/documents"


def detach(conv_id: str, doc_id: str) -> str:
    return f"{_conv(conv_id)}/documents/{_seg(doc_id)}/delete"


def search() -> str:
    """The sidebar's search of the user's conversations."""
    return "/ui/search"


def passage(chunk_id: int) -> str:
    return f"/ui/passages/{_seg(chunk_id)}"


# -- memory and library partials ---------------------------------------------------------


def add_fact() -> str:
    return "/ui/memory/add"


def edit_fact(fact_id: str) -> str:
    return f"/ui/memory/{_seg(fact_id)}/edit"


def delete_fact(fact_id: str) -> str:
    return f"/ui/memory/{_seg(fact_id)}/delete"


def memory_switch() -> str:
    """Memory on or off for the user."""
    return "/ui/memory/enabled"


def upload() -> str:
    """A document added to the user's library."""
    return "/ui/library/documents"


def remove(doc_id: str) -> str:
    """A document deleted from the user's library."""
    return f"/ui/library/documents/{_seg(doc_id)}/delete"


# -- the admin console ---------------------------------------------------------------------


def console() -> str:
    return "/console"


def console_live() -> str:
    return "/console/live"


def console_live_data() -> str:
    """JSON columns of the live plots (`?since=<unix time>` for only newer rows)."""
    return "/console/data/live"


def console_traces() -> str:
    return "/console/traces"


def console_trace(trace_id: str) -> str:
    return f"/console/traces/{_seg(trace_id)}"


def console_traces_data() -> str:
    return "/console/data/traces"


def console_people() -> str:
    return "/console/people"


def console_person(user_id: str) -> str:
    return f"/console/people/{_seg(user_id)}"


def console_person_action(user_id: str, action: str) -> str:
    """POST: tier, role, disable, enable, password, keys."""
    return f"{console_person(user_id)}/{_seg(action)}"


def console_revoke_key(user_id: str, key_id: str) -> str:
    return f"{console_person(user_id)}/revoke-key/{_seg(key_id)}"


def console_usage_data(user_id: str) -> str:
    return f"/console/data/usage/{_seg(user_id)}"


def console_models() -> str:
    return "/console/models"


def console_model_action(name: str, action: str) -> str:
    """POST: load, unload, default."""
    return f"/console/models/{_seg(name)}/{_seg(action)}"


def console_audit() -> str:
    return "/console/audit"


def console_shadow() -> str:
    """Shadow traffic: each served model beside its candidate."""
    return "/console/shadow"


def console_prewarm() -> str:
    """Pre-warming: each model's profile and forecast beside its load."""
    return "/console/prewarm"


def console_workspaces() -> str:
    """GET: every workspace and its members; POST: a new one with its owner."""
    return "/console/workspaces"


def console_workspace_owner(ws_id: str) -> str:
    return f"{console_workspaces()}/{_seg(ws_id)}/owners"


def console_workspace_delete(ws_id: str) -> str:
    return f"{console_workspaces()}/{_seg(ws_id)}/delete"


def console_tools() -> str:
    """GET: the MCP servers, their state and tools; POST: add one."""
    return "/console/tools"


def console_tool_check(name: str) -> str:
    return f"{console_tools()}/{_seg(name)}/check"


def console_tool_remove(name: str) -> str:
    return f"{console_tools()}/{_seg(name)}/remove"


# -- users' data: settings, export, import, deletion, temporary chats --------------------


def data_settings() -> str:
    """The "Your data" page: what is kept, export, import, temporary chats, deletion."""
    return "/settings/data"


def data_retention() -> str:
    """POST: zero-data-retention on or off for oneself."""
    return "/ui/settings/retention"


def data_import() -> str:
    return "/ui/settings/import"


def data_delete_account() -> str:
    return "/ui/settings/delete"


def data_export() -> str:
    """GET: the zip of all one's data."""
    return "/v1/users/me/export"


def temporary_chat(chat_id: str | None = None) -> str:
    """A temporary chat's page (a new one without an id)."""
    return "/temporary" if chat_id is None else f"/temporary/{_seg(chat_id)}"


def temporary_send(chat_id: str | None = None) -> str:
    return "/ui/temporary/send" if chat_id is None else f"/ui/temporary/{_seg(chat_id)}/send"


def temporary_stream(chat_id: str, turn_id: str) -> str:
    return f"/ui/temporary/{_seg(chat_id)}/turns/{_seg(turn_id)}/stream"


def temporary_stop(chat_id: str) -> str:
    return f"/ui/temporary/{_seg(chat_id)}/stop"


# -- share links and workspaces ----------------------------------------------------------


def share_page(token: str) -> str:
    """A share link: the read-only snapshot anyone with the link can read."""
    return f"/s/{_seg(token)}"


def share_continue(token: str) -> str:
    """GET: confirm; POST: copy the snapshot into the reader's own account."""
    return f"{share_page(token)}/continue"


def conversation_shares(conv_id: str) -> str:
    """The API of a conversation's share links (POST: a new link; GET: the list)."""
    return f"/v1/conversations/{_seg(conv_id)}/shares"


def share_revoke(share_id: str) -> str:
    """The API of one share link (DELETE: revoke)."""
    return f"/v1/shares/{_seg(share_id)}"


def workspace_page(ws_id: str) -> str:
    """A workspace's page: its members (owners manage them) and conversations."""
    return f"/w/{_seg(ws_id)}"


def workspace_add_member(ws_id: str) -> str:
    return f"/ui/w/{_seg(ws_id)}/members"


def workspace_remove_member(ws_id: str, user_id: str) -> str:
    return f"/ui/w/{_seg(ws_id)}/members/{_seg(user_id)}/delete"


def workspace_upload(ws_id: str) -> str:
    """A document added to the workspace's library."""
    return f"/ui/w/{_seg(ws_id)}/documents"


def workspace_remove_document(ws_id: str, doc_id: str) -> str:
    return f"{workspace_upload(ws_id)}/{_seg(doc_id)}/delete"


# -- moderation review queue (admins) ----------------------------------------------------


def moderation_queue() -> str:
    return "/admin/moderation"


def moderation_item(item_id: str) -> str:
    return f"{moderation_queue()}/{_seg(item_id)}"


def moderation_resolve(item_id: str) -> str:
    """POST: dismiss or confirm (hx-vals `action`)."""
    return f"{moderation_item(item_id)}/resolve"


def feedback(conv_id: str, turn_id: str) -> str:
    """Rating an answer (thumbs) and saying why."""
    return f"{_turn(conv_id, turn_id)}/feedback"


def console_evals() -> str:
    """GET: eval runs, newest first; ?runs=ID&runs=ID compares runs case by case."""
    return "/console/evals"


def console_eval_run(run_id: str) -> str:
    return f"{console_evals()}/{_seg(run_id)}"


def console_canaries() -> str:
    """GET: each canary's state, verdict and metrics."""
    return "/console/canaries"


def console_canary_action(arm: str, action: str) -> str:
    """POST: promote, rollback, resume."""
    return f"{console_canaries()}/{_seg(arm)}/{_seg(action)}"
