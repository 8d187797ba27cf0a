"""Every Redis key Lucid uses, named once (`Keys`)."""


class Keys:
    """Call a key with its parts (`Keys.inbox(ns.key)`). They all start with PREFIX; `ns` is a Namespace.key,
    `message` a Feishu message id. docs/PRIVACY.md says what `lucid erase` does to each."""

    PREFIX = "lucid:"
    lease = "lucid:lease:{}".format  # ns: the writer's lock (owner string, PX ttl)
    fence = "lucid:fence:{}".format  # ns: the writer's fencing counter (INCR)
    ops = "lucid:ops:{}".format  # ns: the writer's pending ops, JSON, oldest first
    result = "lucid:res:{}".format  # op id: the op's outcome, a list its submitter BLPOPs
    INBOXES = "lucid:inboxes"  # namespaces whose inbox may hold messages → when to look (Redis clock, ms)
    inbox = "lucid:inbox:{}".format  # ns: a person's unanswered messages by create time
    turn_lock = "lucid:turnlock:{}".format  # ns: held while a turn job answers the inbox
    turn_job = "lucid:turnjob:{}".format  # ns: the id of the person's one turn job
    resumed = "lucid:resumed:{}".format  # ns: the last turn job the sweep queued
    busy = "lucid:busy:{}".format  # ns: the person was told their backlog is long
    turn_done = "lucid:turndone:{}:{}".format  # persona, message: answered
    turn_tries = "lucid:turntry:{}:{}".format  # persona, message: turns started on it
    SEEN = "lucid:seen:"  # dedupe claims of Feishu ids (value "1", kept until they expire)
    seen_message = "lucid:seen:m:{}:{}".format  # persona, message
    seen_event = "lucid:seen:e:{}:{}".format  # persona, event id
    seen_card = "lucid:seen:card:{}:{}".format  # persona, card action event id
    SWEEPING = "lucid:sweeping"  # whoever sets it sweeps the inboxes this interval
    REPLIES_DUE = "lucid:replies:due"  # "<persona>\x1f<message>" → when its reply's next job is due (ms)
    reply = "lucid:reply:{}:{}".format  # persona, message: a parked reply (hash)
    replies = "lucid:replies:{}:{}".format  # persona, chat: the chat's parked replies by create time
    reply_lock = "lucid:replylock:{}:{}".format  # persona, message: held while one attempt sends it
    thinking = "lucid:thinking:{}:{}".format  # persona, message: the "thinking" reaction's id
    card = "lucid:card:{}:{}".format  # persona, message: the streaming card of its reply
    card_seq = "lucid:card-seq:{}".format  # card id: its update sequence (INCR)
    memory_card = "lucid:memcard:{}:{}".format  # persona, card message: what a /memory card shows
    session = "lucid:session:{}".format  # chat key: the conversation's session id
    history = "lucid:history:{}".format  # chat key (`<ns>:<chat>`): the last turns replayed to the model
    language = "lucid:lang:{}".format  # chat key: the language the person writes in
    flag = "lucid:flag:{}".format  # name: a short-lived flag (the model is down, CardKit refused, …)
    resident = "lucid:resident:{}:{}:{}:{}".format  # ns, chat type, chat, session: the frozen resident tier
    memory_off = "lucid:memoff:{}:{}:{}".format  # tenant, persona, chat: the chat's memory switch (+ ":gen")
    pace = "lucid:pace:{}:{}".format  # bucket (chat, app, appmin), its id: the next free send slot (ms)
    viewer_session = "lucid:viewer:session:{}".format  # sha256 of a viewer session id
    viewer_failures = "lucid:viewer:failures:{}".format  # sha256 of a client address: its failed logins
    METRICS = "lucid:metrics"  # every counter and histogram, one hash
