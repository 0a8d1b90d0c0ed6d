-- Shared state of deployment-wide admission: one Redis function library. This file holds what
-- every entry shares; each other file of this folder is the body of one function (see
-- scripts.py, which assembles and names the library).
--
-- Arguments, the first three the same for every function:
--   1 the calling process's settings, one JSON array that a process sends unchanged with every
--     call: key prefix, idle TTL of counters (ms), process id, process lease TTL (ms), recovery
--     grace (ms) after the shared state was created, invocation budget TTL (ms);
--   2 workspace id ('' for the heartbeat), 3 epoch the caller knows ('' if none).
-- Entry-specific arguments start at ARGV[4]. Keys are built here from the prefix.
--
-- Every key a call touches lives in one hash slot: a workspace's keys carry its hash tag, and the
-- deployment's process registry has a tag of its own (`{}`), so the state can be sharded across
-- a Redis Cluster by workspace. The caller names one key of that slot (KEYS[1]) so a cluster
-- client routes the call to the slot's primary; on a single Redis the key changes nothing.
--
-- Key layout:
--   P:{}:procs               zset  process -> lease expiry (server ms): the deployment's registry
--   P:{ws}:procs             zset  process -> lease expiry (server ms), processes acting here
--   P:{ws}:g:<process>       list  grants and verdicts for that process's waiters (BLPOP)
--   P:{ws}:prof              hash  rev, pseq, dg, and one flat field of limits per scope (W,
--                                  V:<provider>, P:<principal>; see LIMIT_FIELDS), rsv; and the
--                                  workspace state's life (epoch_check): e:id, e:ready, e:at,
--                                  e:wait, e:r:<process>, never replicated, so a promoted
--                                  replica or a restarted Redis starts a new one
--   P:{ws}:meta              hash  rr (rotation counter), wk (next time-based wake, server ms)
--   P:{ws}:s                 hash  one field per scope (W, P:<id>, V:<id>, X:<provider><id>),
--                                  and one per lease (L<lease id> -> the lease; `off`: a grant
--                                  not yet taken, see take), so that a decision reads and writes
--                                  its scopes and leases together; a scope's value is its state
--                                  packed (see FIELDS): a (active)
--                                  q (queued) rl rt (request bucket level, time) tl tt (token
--                                  bucket) h ht (token holder, its tokens) pz (pause until)
--                                  bs bf bg bo bp (breaker) pl (last retry-pressure event);
--                                  in W also tb (when the last tombstone lapses) and ox (grants
--                                  may be pending). Expires IDLE_TTL after the workspace idles.
--   P:{ws}:b:<budget>        hash  invocation budgets per scope
--   P:{ws}:r:<budget>        string the providers an invocation was admitted on (each as
--                                  <length>:<id>), so a second admission there is a repeat;
--                                  lives BUDGET_TTL from the invocation's first admission, or
--                                  until the invocation is forgotten (release_budget)
--   P:{ws}:pr:<provider>     list  retry-pressure events (server ms), 60 s window
--   P:{ws}:off               zset  lease id -> time its grant lapses if not taken (server ms)
--   P:{ws}:t:<id>            string a withdrawn request id (a late acquire of it is refused)
--   P:{ws}:W                 hash  waiter id -> waiter
--   P:{ws}:q:<lane>          list  waiter ids of one (provider, principal) lane, oldest first
--   P:{ws}:rot               zset  lane -> rotation position (least recently served first)
--   P:{ws}:bt                list  breaker transitions, newest first, bounded
--   P:{ws}:ct:<minute>       hash  decisions of one minute by provider|decision|reason (2 h);
--                                  a caller counts its own acquires and reports them with its
--                                  heartbeat (or on settling), the functions count the rest
--   P:{ws}:tot               hash  the same, totals since the state began

-- The arguments and the time of the call being served; `begin` sets them for every call.
local ARGV, PFX, IDLE_TTL, IDLE_TTL_TEXT, BUDGET_TTL_TEXT, PROC, PROC_TTL, KNOWN_EPOCH, GRACE, BUDGET_TTL, NOW
local PROCS
-- When admission in the current workspace may resume after its state was lost (server ms).
local EPOCH_READY = nil
-- Set by an entry when its caller is in this workspace's P:{ws}:procs already.
local REGISTERED = false
-- The epoch the common acquire read (its key, id and ready time) when it had no processes left
-- to wait for: epoch_check takes it rather than reading it again.
local READ_EPOCH_KEY, READ_EPOCH_ID, READ_EPOCH_READY = nil, nil, nil
-- The epoch's fields in the profile hash (see the key layout).
local E_ID, E_READY, E_AT, E_WAIT = 'e:id', 'e:ready', 'e:at', 'e:wait'

local EPS = 1e-9
local PRESSURE_WINDOW = 60000
local PRESSURE_CAP = 4096
local TRANSITION_HISTORY = 256
-- Standard libraries are reachable only while a call runs (begin sets these).
local floor, max, min

-- Ids may hold any character: a length prefix keeps composite names unambiguous.
local function enc(s)
  return #s .. ':' .. s
end

local WS, BASE, PROF, META, WAITERS, ROT, TRANS, OFFERS, STATE
-- A grant made for a waiting request must be taken by its process within this long (a share of
-- the process lease TTL), or it goes back to the pool.
local GRANT_TTL
local LIM, SC, BUD, ALIVE, RESULT_TRANSITIONS
-- The profile's revision as this call read it (nil: not read yet; false: no profile).
local REV
-- NOW as stored (formatted once per call), and NOW in whole microseconds.
local NOW_TEXT, NOW_US
-- The whole seconds of NOW, as TIME gave them.
local NOW_S

-- A scope's state is one field of the workspace's state hash (P:{ws}:s), its value the fields
-- below in this order, comma-separated, '' for a field at its default, trailing defaults left
-- out; `h` (a waiter id) comes last and takes the rest of the value. A scope at its defaults
-- has no field at all.
local FIELDS = {'a', 'q', 'rl', 'rt', 'tl', 'tt', 'ht', 'pz', 'bs', 'bf', 'bg', 'bo', 'bp', 'pl',
  'tb', 'ox', 'h'}
local TEXT = {h = true, bs = true}
local ZERO_IS_DEFAULT = {a = true, q = true, bf = true, bp = true}

local function is_idle(a, q, h)
  return (a or 0) == 0 and (q or 0) == 0 and h == nil
end

-- Whole numbers below 2^53 print exactly as integers; others keep 17 significant digits.
-- Small whole numbers as text and short texts as numbers, kept between calls (counts repeat;
-- the conversions depend on the value alone).
local INT_TEXT = {}
local SHORT_NUM, SHORT_NUM_COUNT = {}, 0
local WHOLE_TEXT, WHOLE_TEXT_COUNT = {}, 0

-- Three-digit texts '000' to '999', made on the first call that needs them.
local PAD3 = nil

-- NOW as stored: whole milliseconds, or three decimals (the microseconds), which read back as
-- NOW exactly (NOW is within far less than half a thousandth of that decimal). Put together
-- from the seconds as TIME gave them (NOW_S) and the digits after them, with no formatting.
local function now_text()
  local micro = NOW_US % 1000
  if NOW_US < 1e6 then
    -- (Within the first second the seconds' '0' would lead the digits.)
    if micro == 0 then return string.format('%d', NOW) end
    return string.format('%d.%03d', (NOW_US - micro) / 1000, micro)
  end
  if PAD3 == nil then
    PAD3 = {}
    for i = 0, 999 do PAD3[i] = string.format('%03d', i) end
  end
  local ms = PAD3[(NOW_US % 1000000 - micro) / 1000]
  if micro == 0 then return NOW_S .. ms end
  return NOW_S .. ms .. '.' .. PAD3[micro]
end

local function num(v)
  if v == NOW then
    if NOW_TEXT == nil then NOW_TEXT = now_text() end
    return NOW_TEXT
  end
  if v >= 0 and v < 1024 then
    local text = INT_TEXT[v]
    if text ~= nil then return text end
    if v == floor(v) then
      text = string.format('%d', v)
      INT_TEXT[v] = text
      return text
    end
  end
  if v == floor(v) and v < 9007199254740992 and v > -9007199254740992 then
    -- Bucket levels at or near their capacity repeat from call to call.
    local text = WHOLE_TEXT[v]
    if text == nil then
      text = string.format('%d', v)
      if WHOLE_TEXT_COUNT >= 4096 then WHOLE_TEXT, WHOLE_TEXT_COUNT = {}, 0 end
      WHOLE_TEXT[v] = text
      WHOLE_TEXT_COUNT = WHOLE_TEXT_COUNT + 1
    end
    return text
  end
  return string.format('%.17g', v)
end

-- A string as JSON, written directly when it needs no escaping (ids usually do not).
local function json_string(s)
  if string.find(s, '[%c"\\\128-\255]') then return cjson.encode(s) end
  return '"' .. s .. '"'
end

-- The same, kept between calls, for texts that recur (epochs, processes, principals,
-- providers); ids used once (budgets) go without.
local JSON_TEXTS, JSON_TEXTS_COUNT = {}, 0

local function json_text(s)
  local out = JSON_TEXTS[s]
  if out == nil then
    out = json_string(s)
    if JSON_TEXTS_COUNT >= 256 then JSON_TEXTS, JSON_TEXTS_COUNT = {}, 0 end
    JSON_TEXTS[s] = out
    JSON_TEXTS_COUNT = JSON_TEXTS_COUNT + 1
  end
  return out
end

-- A stored number's text as a number, from the cache (counts and levels repeat; the times a
-- call wrote are read back by the next, several scopes holding the same one).
local function stored_num(text)
  local v = SHORT_NUM[text]
  if v == nil then
    v = tonumber(text)
    if v == nil then return nil end
    if SHORT_NUM_COUNT >= 4096 then SHORT_NUM, SHORT_NUM_COUNT = {}, 0 end
    SHORT_NUM[text] = v
    SHORT_NUM_COUNT = SHORT_NUM_COUNT + 1
  end
  return v
end

-- The values of records packed in the common shape (counts and buckets), by their text: the
-- next call reads back what this one wrote, without parsing it (what a text holds depends on the
-- text alone). Emptied when it holds too many.
local UNPACKED, UNPACKED_COUNT = {}, 0

local function remember(packed, values)
  if UNPACKED_COUNT >= 4096 then UNPACKED, UNPACKED_COUNT = {}, 0 end
  UNPACKED[packed] = values
  UNPACKED_COUNT = UNPACKED_COUNT + 1
end

-- A scope in the common shape (its counts and buckets only), packed.
local function pack_common(a, q, rl, rt, tl, tt)
  if rl == nil and rt == nil and tl == nil and tt == nil then
    if q == nil or q == 0 then
      if a == nil or a == 0 then return '' end
      return INT_TEXT[a] or num(a)
    end
    if a == nil or a == 0 then return ',' .. (INT_TEXT[q] or num(q)) end
    return (INT_TEXT[a] or num(a)) .. ',' .. (INT_TEXT[q] or num(q))
  end
  local pa, pq, prl, prt, ptl = '', '', '', '', ''
  if a ~= nil and a ~= 0 then pa = INT_TEXT[a] or num(a) end
  if q ~= nil and q ~= 0 then pq = INT_TEXT[q] or num(q) end
  if rl ~= nil then prl = WHOLE_TEXT[rl] or num(rl) end
  if rt ~= nil then prt = rt == NOW and NOW_TEXT or num(rt) end
  local packed
  if tt ~= nil then
    if tl ~= nil then ptl = WHOLE_TEXT[tl] or num(tl) end
    local ptt = tt == NOW and NOW_TEXT or num(tt)
    packed = pa .. ',' .. pq .. ',' .. prl .. ',' .. prt .. ',' .. ptl .. ',' .. ptt
  elseif tl ~= nil then
    packed = pa .. ',' .. pq .. ',' .. prl .. ',' .. prt .. ',' .. num(tl)
  elseif rt ~= nil then
    packed = pa .. ',' .. pq .. ',' .. prl .. ',' .. prt
  else
    packed = pa .. ',' .. pq .. ',' .. prl
  end
  if UNPACKED[packed] == nil then
    if pa == '' then a = nil end
    if pq == '' then q = nil end
    remember(packed, {a, q, rl, rt, tl, tt})
  end
  return packed
end

local function pack_scope(s)
  if s.ht == nil and s.pz == nil and s.bs == nil and s.bf == nil and s.bg == nil
      and s.bo == nil and s.bp == nil and s.pl == nil and s.tb == nil and s.ox == nil
      and s.h == nil then
    return pack_common(s.a, s.q, s.rl, s.rt, s.tl, s.tt)
  end
  local parts, last = {'', '', '', '', '', '', '', '', '', '', '', '', '', '', '', '', ''}, 0
  for i = 1, #FIELDS do
    local f = FIELDS[i]
    local v = s[f]
    if v == nil or (v == 0 and ZERO_IS_DEFAULT[f]) then
      parts[i] = ''
    else
      if TEXT[f] then parts[i] = v else parts[i] = num(v) end
      last = i
    end
  end
  if last == 0 then return '' end
  return table.concat(parts, ',', 1, last)
end

local function unpack_scope(raw, s)
  local known = UNPACKED[raw]
  if known ~= nil then
    -- Written by a call before (see remember): the values it packed.
    local a, q, rl, rt, tl, tt = known[1], known[2], known[3], known[4], known[5], known[6]
    if a ~= nil then s.a = a end
    if q ~= nil then s.q = q end
    if rl ~= nil then s.rl = rl end
    if rt ~= nil then s.rt = rt end
    if tl ~= nil then s.tl = tl end
    if tt ~= nil then s.tt = tt end
    return
  end
  local pos, n = 1, #FIELDS
  for i = 1, n - 1 do
    local comma = string.find(raw, ',', pos, true)
    local piece = string.sub(raw, pos, (comma or 0) - 1)
    if piece ~= '' then
      local f = FIELDS[i]
      if TEXT[f] then s[f] = piece else s[f] = SHORT_NUM[piece] or stored_num(piece) end
    end
    if not comma then return end
    pos = comma + 1
  end
  local rest = string.sub(raw, pos)
  if rest ~= '' then s.h = rest end
end

-- A stored scope in the common shape (counts and buckets only): a, q (0 when absent), rl, rt,
-- tl, tt; false when it holds any other field.
local function unpack_common(raw)
  local known = UNPACKED[raw]
  if known == nil then
    if raw == '' then return 0, 0 end
    known = {}
    local pos = 1
    for i = 1, 6 do
      local comma = string.find(raw, ',', pos, true)
      if comma and i == 6 then return false end
      local piece = string.sub(raw, pos, (comma or 0) - 1)
      if piece ~= '' then
        local v = SHORT_NUM[piece] or stored_num(piece)
        if v == nil then return false end
        known[i] = v
      end
      if not comma then break end
      pos = comma + 1
    end
    remember(raw, known)
  end
  return known[1] or 0, known[2] or 0, known[3], known[4], known[5], known[6]
end

-- The state hash of an idle workspace expires IDLE_TTL after its last change; a busy one never
-- expires.
local function flush()
  if SC == nil then return end
  local set, del, changed = {}, nil, false
  for name, s in pairs(SC) do
    if s._dirty then
      local packed = pack_scope(s)
      if packed ~= s._raw then
        if packed == '' then
          if del == nil then del = {} end
          del[#del + 1] = name
        else
          set[#set + 1] = name
          set[#set + 1] = packed
        end
        s._raw = packed
        changed = true
      end
      s._dirty = false
    end
  end
  if not changed then return end
  if del ~= nil then redis.call('HDEL', STATE, unpack(del)) end
  if #set > 0 then redis.call('HSET', STATE, unpack(set)) end
  local sw = SC['W']
  if sw == nil then
    -- Only other scopes changed (a pause): the workspace's idleness decides.
    local raw = redis.call('HGET', STATE, 'W')
    sw = {}
    if raw then unpack_scope(raw, sw) end
    if is_idle(sw.a, sw.q, sw.h) then redis.call('PEXPIRE', STATE, IDLE_TTL_TEXT) end
    return
  end
  local idle = is_idle(sw.a, sw.q, sw.h)
  if idle then
    redis.call('PEXPIRE', STATE, IDLE_TTL_TEXT)
  elseif sw._idle then
    redis.call('PERSIST', STATE)
  end
  sw._idle = idle
end

-- A workspace's key names by prefix and workspace, kept between calls (emptied when too many).
local KEYSETS, KEYSETS_COUNT = {}, 0

local function keyset(ws)
  local of = KEYSETS[PFX]
  if of == nil then
    of = {}
    KEYSETS[PFX] = of
  end
  local k = of[ws]
  if k == nil then
    if KEYSETS_COUNT >= 4096 then
      KEYSETS, KEYSETS_COUNT = {}, 0
      of = {}
      KEYSETS[PFX] = of
    end
    local base = PFX .. ':{' .. ws .. '}:'
    k = {base, base .. 'prof', base .. 'meta', base .. 'W', base .. 'rot', base .. 'bt',
      base .. 'off', base .. 's', base .. 'procs'}
    of[ws] = k
    KEYSETS_COUNT = KEYSETS_COUNT + 1
  end
  return k
end

local function use_ws(ws)
  flush()
  WS = ws
  local k = keyset(ws)
  BASE, PROF, META, WAITERS, ROT = k[1], k[2], k[3], k[4], k[5]
  TRANS, OFFERS, STATE, PROCS = k[6], k[7], k[8], k[9]
  EPOCH_READY = nil
  -- Room for the scopes and limits of a decision and a lease given back, set without growing.
  LIM = {W = nil, rsv = nil, l1 = nil, l2 = nil, l3 = nil, l4 = nil, l5 = nil, l6 = nil}
  SC = {W = nil, s1 = nil, s2 = nil, s3 = nil, s4 = nil, s5 = nil, s6 = nil, s7 = nil}
  BUD = nil
  REV = nil
  ALIVE = nil
end

-- A process's settings (the first argument) decoded, by their text: a deployment sends the
-- same few texts. Each is {prefix, idle TTL, process id, process lease TTL, grace, budget TTL,
-- the idle TTL's and the budget TTL's texts as Redis's commands take them}.
local SETTINGS, SETTINGS_COUNT = {}, 0

local function settings(text)
  local v = SETTINGS[text]
  if v == nil then
    local ok, d = pcall(cjson.decode, text)
    if not ok or type(d) ~= 'table' or type(d[1]) ~= 'string' or type(d[3]) ~= 'string' then
      error('malformed settings argument')
    end
    for i = 2, 6 do
      if i ~= 3 and type(d[i]) ~= 'number' then error('malformed settings argument') end
    end
    v = {d[1], d[2], d[3], d[4], d[5], d[6], string.format('%d', d[2]), string.format('%d', d[6])}
    if SETTINGS_COUNT >= 256 then SETTINGS, SETTINGS_COUNT = {}, 0 end
    SETTINGS[text] = v
    SETTINGS_COUNT = SETTINGS_COUNT + 1
  end
  return v
end

-- A call starts from nothing: no decision state is carried from one call to the next (what is
-- kept is derived from the arguments' and the profile's text alone: names, parsed limits).
local function begin(args)
  floor, max, min = math.floor, math.max, math.min
  ARGV = args
  local s = SETTINGS[args[1]] or settings(args[1])
  PFX, IDLE_TTL, PROC, PROC_TTL, GRACE, BUDGET_TTL = s[1], s[2], s[3], s[4], s[5], s[6]
  IDLE_TTL_TEXT, BUDGET_TTL_TEXT = s[7], s[8]
  KNOWN_EPOCH = args[3]
  GRANT_TTL = PROC_TTL / 2
  -- The time in ms, with the microseconds as three decimals: one division of the whole number of
  -- microseconds, so NOW is the value of that decimal text exactly (see now_text).
  local t = redis.call('TIME')
  NOW_US = t[1] * 1000000 + t[2]
  NOW_S = t[1]
  NOW = NOW_US / 1000
  PROCS = nil
  REGISTERED = false
  WS, BASE, PROF, META, WAITERS, ROT, TRANS = nil, nil, nil, nil, nil, nil, nil
  OFFERS, STATE = nil, nil
  LIM, SC, BUD, ALIVE = nil, nil, nil, nil
  REV, NOW_TEXT = nil, nil
  RESULT_TRANSITIONS = {}
  READ_EPOCH_KEY = nil
end

-- ------------------------------------------------------------------ epoch and processes

local function proc_alive(proc)
  if ALIVE == nil then ALIVE = {} end
  local alive = ALIVE[proc]
  if alive == nil then
    local score = redis.call('ZSCORE', PROCS, proc)
    alive = score ~= false and score ~= nil and tonumber(score) > NOW
    ALIVE[proc] = alive
  end
  return alive
end

-- A workspace's shared state has a life (an epoch). When Redis loses it (a restart without
-- persistence, or a replica promoted after its primary failed, which may lack the primary's last
-- writes), the first call creates a new epoch and admission in the workspace waits GRACE ms, so
-- that every live process sees the new epoch and re-asserts the permits it still holds first.
-- The grace lasts until every process alive in the workspace when the epoch began has re-asserted
-- (or is alive no more, or a lease TTL has passed): a process slow to find the new primary (its
-- map of the slots is stale, its loop is starved) must not find its permits handed out again.
-- The epoch is written on this server only (never replicated nor persisted): a promoted replica
-- has none, so it starts a new one. Its fields live in the profile hash, which every decision
-- reads anyway (one key fewer per decision).
local function epoch_write(...)
  redis.set_repl(redis.REPL_NONE)
  redis.call('HSET', PROF, ...)
  redis.set_repl(redis.REPL_ALL)
end

-- The processes of the new epoch's `wait` list that have still to re-assert; the epoch's ready
-- time once none is left, else a moment from now (the next look).
local function epoch_waiting(ready, waiting, began)
  local left = {}
  if NOW < began + PROC_TTL then
    for _, proc in ipairs(cjson.decode(waiting)) do
      if redis.call('HEXISTS', PROF, 'e:r:' .. proc) == 0 and proc_alive(proc) then
        left[#left + 1] = proc
      end
    end
  end
  redis.set_repl(redis.REPL_NONE)
  if #left == 0 then
    redis.call('HDEL', PROF, E_WAIT)
  else
    redis.call('HSET', PROF, E_WAIT, cjson.encode(left))
  end
  redis.set_repl(redis.REPL_ALL)
  if #left == 0 then return ready end
  return NOW + min(GRACE, 100)
end

local function epoch_check()
  if READ_EPOCH_KEY == PROF then
    EPOCH_READY = READ_EPOCH_READY
    return READ_EPOCH_ID, READ_EPOCH_READY
  end
  local stored = redis.call('HMGET', PROF, E_ID, E_READY, E_WAIT, E_AT)
  local id, ready = stored[1], stored[2] and stored_num(stored[2]) or 0
  if not id then
    id = PROC .. '@' .. string.format('%.0f', NOW)
    ready = NOW + GRACE
    local live = redis.call('ZRANGEBYSCORE', PROCS, '(' .. string.format('%.17g', NOW), '+inf')
    if #live > 0 then
      epoch_write(E_ID, id, E_READY, string.format('%.17g', ready),
        E_AT, string.format('%.17g', NOW), E_WAIT, cjson.encode(live))
    else
      epoch_write(E_ID, id, E_READY, string.format('%.17g', ready),
        E_AT, string.format('%.17g', NOW))
    end
  elseif stored[3] and NOW >= ready then
    ready = epoch_waiting(ready, stored[3], tonumber(stored[4]) or 0)
  end
  EPOCH_READY = ready
  return id, ready
end

-- The calling process has put back its permits in the current epoch (noted only while the
-- epoch waits for processes to do so).
local function epoch_reasserted()
  if redis.call('HEXISTS', PROF, E_WAIT) == 1 then epoch_write('e:r:' .. PROC, '1') end
end

-- When the current epoch began (server ms).
local function epoch_began()
  return tonumber(redis.call('HGET', PROF, E_AT)) or 0
end

-- The calling process acts in this workspace (until its lease here lapses). Returns true when
-- it was not known here (a first call, or it had been given up for dead).
local function heartbeat()
  local added = redis.call('ZADD', PROCS, string.format('%.17g', NOW + PROC_TTL), PROC)
  if ALIVE == nil then ALIVE = {} end
  ALIVE[PROC] = true
  return added == 1
end

-- ----------------------------------------------------------------------- state access

-- A scope's limits are one field of the profile hash, its value the limits below in this order,
-- comma-separated, '' when absent (written by `profile_fields` in controller.py); `rsv` lists the
-- principals with reserved permits as <len>:<id><permits>; pairs.
local LIMIT_FIELDS = {'c', 'rpm', 'tps', 'ma', 'mc', 'mt', 'ql', 'qw', 'sh', 'rc', 'ft', 'om', 'hm'}

local function parse_limits(raw)
  local lim, pos = {}, 1
  for i = 1, #LIMIT_FIELDS do
    local comma = string.find(raw, ',', pos, true)
    local piece = string.sub(raw, pos, (comma or 0) - 1)
    if piece ~= '' then lim[LIMIT_FIELDS[i]] = tonumber(piece) end
    if not comma then break end
    pos = comma + 1
  end
  if lim.ft ~= nil then
    lim.bk = {ft = lim.ft, om = lim.om, hm = lim.hm}
    lim.ft, lim.om, lim.hm = nil, nil, nil
  end
  -- Whether the scope keeps invocation budgets (attempts, cost or tokens).
  lim.budgeted = lim.ma ~= nil or lim.mc ~= nil or lim.mt ~= nil
  return lim
end

local function parse_reserved(raw)
  local out, pos = {}, 1
  while pos <= #raw do
    local colon = string.find(raw, ':', pos, true)
    local n = tonumber(string.sub(raw, pos, colon - 1))
    local id = string.sub(raw, colon + 1, colon + n)
    local semi = string.find(raw, ';', colon + n + 1, true)
    out[id] = tonumber(string.sub(raw, colon + n + 1, semi - 1))
    pos = semi + 1
  end
  return out
end

-- Parsed limits by their stored text. Parsing depends on the text alone and nothing changes a
-- parsed table, so the parse of a text is kept between calls (a profile's fields rarely change);
-- the cache is emptied when it holds too many texts.
local PARSED, PARSED_RSV, PARSED_COUNT = {}, {}, 0
local PARSED_MAX = 4096

local function decode_limits(field, raw)
  if not raw then return false end
  local cache = PARSED
  if field == 'rsv' then cache = PARSED_RSV end
  local v = cache[raw]
  if v == nil then
    if PARSED_COUNT >= PARSED_MAX then
      PARSED, PARSED_RSV, PARSED_COUNT = {}, {}, 0
      if field == 'rsv' then cache = PARSED_RSV else cache = PARSED end
    end
    if field == 'rsv' then v = parse_reserved(raw) else v = parse_limits(raw) end
    cache[raw] = v
    PARSED_COUNT = PARSED_COUNT + 1
  end
  return v
end

local function limits(field)
  local v = LIM[field]
  if v == nil then
    v = decode_limits(field, redis.call('HGET', PROF, field))
    LIM[field] = v
  end
  return v
end

-- The revision and the limits a decision needs, in one read of what this call has not read yet
-- (none when it has read them all). Returns the revision.
local function preload(...)
  local fields = {...}
  local missing = {}
  if REV == nil then missing[1] = 'rev' end
  for i = 1, #fields do
    if LIM[fields[i]] == nil then missing[#missing + 1] = fields[i] end
  end
  if #missing == 0 then return REV end
  local raw = redis.call('HMGET', PROF, unpack(missing))
  local from = 1
  if REV == nil then
    REV = raw[1] or false
    from = 2
  end
  for i = from, #missing do LIM[missing[i]] = decode_limits(missing[i], raw[i]) end
  return REV
end

-- Scopes are named W, P:<principal>, V:<provider> and X:<provider, length-prefixed><principal>.
-- The names depend on the ids alone, so they are kept between calls (emptied when too many).
-- A budget hash counts an invocation's admissions per provider in the field r<provider,
-- length-prefixed>.
local NAMES_P, NAMES_V, NAMES_X, NAMES_R, NAMES_COUNT = {}, {}, {}, {}, 0
local NAMES_MAX = 8192

local function named(count)
  NAMES_COUNT = NAMES_COUNT + count
  if NAMES_COUNT > NAMES_MAX then
    NAMES_P, NAMES_V, NAMES_X, NAMES_R, NAMES_COUNT = {}, {}, {}, {}, 0
  end
end

local function key_w() return 'W' end
local function key_p(pid)
  local n = NAMES_P[pid]
  if n == nil then
    named(1)
    n = 'P:' .. pid
    NAMES_P[pid] = n
  end
  return n
end
local function key_v(prov)
  local n = NAMES_V[prov]
  if n == nil then
    named(1)
    n = 'V:' .. prov
    NAMES_V[prov] = n
  end
  return n
end
local function key_x(prov, pid)
  local of = NAMES_X[prov]
  if of == nil then
    named(1)
    of = {}
    NAMES_X[prov] = of
  end
  local n = of[pid]
  if n == nil then
    named(1)
    n = 'X:' .. enc(prov) .. pid
    of[pid] = n
  end
  return n
end
local function key_r(prov)
  local n = NAMES_R[prov]
  if n == nil then
    named(1)
    n = enc(prov)
    NAMES_R[prov] = n
  end
  return n
end
local function lane_of(prov, pid) return enc(prov) .. pid end
local function lane_key(lane) return BASE .. 'q:' .. lane end

local function split_lane(lane)
  local colon = string.find(lane, ':', 1, true)
  local n = tonumber(string.sub(lane, 1, colon - 1))
  return string.sub(lane, colon + 1, colon + n), string.sub(lane, colon + n + 1)
end

local function new_scope(name, raw)
  -- Built with room for the fields a decision sets, so setting them grows nothing.
  local s = {_key = name, _raw = raw or '', a = 0, q = 0, rl = nil, rt = nil, tl = nil, tt = nil,
    _dirty = false, _idle = nil}
  if raw then unpack_scope(raw, s) end
  s.a = s.a or 0
  s.q = s.q or 0
  if name == 'W' then s._idle = is_idle(s.a, s.q, s.h) end
  SC[name] = s
  return s
end

-- Loads the named scopes not loaded yet, in one read.
local function load_scopes(names)
  local missing = {}
  for _, name in ipairs(names) do
    if SC[name] == nil then missing[#missing + 1] = name end
  end
  if #missing == 0 then return end
  local raw = redis.call('HMGET', STATE, unpack(missing))
  for i, name in ipairs(missing) do
    if SC[name] == nil then new_scope(name, raw[i] or nil) end
  end
end

local function scope(name)
  local s = SC[name]
  if s == nil then s = new_scope(name, redis.call('HGET', STATE, name) or nil) end
  return s
end

-- The four scopes of one (principal, provider) pair, loaded together.
local function scopes_of(pid, prov)
  local np, nv, nx = NAMES_P[pid], NAMES_V[prov], nil
  local of = NAMES_X[prov]
  if of ~= nil then nx = of[pid] end
  if np == nil then np = key_p(pid) end
  if nv == nil then nv = key_v(prov) end
  if nx == nil then nx = key_x(prov, pid) end
  local sp, sw, sv, sx = SC[np], SC['W'], SC[nv], SC[nx]
  if sp ~= nil and sw ~= nil and sv ~= nil and sx ~= nil then return sp, sw, sv, sx end
  load_scopes({np, 'W', nv, nx})
  return SC[np], SC['W'], SC[nv], SC[nx]
end

-- (A changed scope is marked `_dirty`; flush writes the marked ones.)

local function budget(bud)
  local key = BASE .. 'b:' .. bud
  if BUD == nil then BUD = {} end
  local b = BUD[key]
  if b == nil then
    b = {}
    local flat = redis.call('HGETALL', key)
    for i = 1, #flat, 2 do b[flat[i]] = tonumber(flat[i + 1]) end
    BUD[key] = b
  end
  return b
end

local function waiter(wid)
  local raw = redis.call('HGET', WAITERS, wid)
  if raw then return cjson.decode(raw) end
  return nil
end

-- --------------------------------------------------------------------------- buckets

-- A bucket's level and time are the fields `lf` and `tf` of its scope (rl, rt or tl, tt).
-- A bucket's level now, from its stored level and time (nil: full).
local function refilled(lvl, t, cap, rate)
  if lvl == nil then return cap end
  local elapsed = NOW - (t or NOW)
  if elapsed > 0 then lvl = lvl + elapsed * rate end
  if lvl > cap then lvl = cap end
  return lvl
end

-- A bucket's level and time to store once `amount` is taken from its level now (nil, nil:
-- full again).
local function taken(lvl, cap, amount)
  lvl = lvl - amount
  if lvl >= cap - EPS then return nil, nil end
  return lvl, NOW
end

local function refill(s, lf, tf, cap, rate)
  return refilled(s[lf], s[tf], cap, rate)
end

local function consume(s, lf, tf, cap, rate, amount)
  s[lf], s[tf] = taken(refilled(s[lf], s[tf], cap, rate), cap, amount)
  s._dirty = true
end

-- Per-minute counts of decisions by provider, decision and reason, kept two hours, and running
-- totals, for operators' views; they carry no principal id. Beside the decisions: the admitted
-- queue delay as 'delay|<bucket bound ms>' and 'delay|sum' (whole ms), and breaker transitions
-- as 'transition|<from>><to>'.
local COUNT_TTL = 7200000
local DELAY_BOUNDS = {0, 5, 25, 100, 250, 1000, 2500, 10000, 30000}

local function count(prov, decision, reason, n)
  n = n or 1
  local field = enc(prov) .. decision .. '|' .. reason
  local key = BASE .. 'ct:' .. string.format('%.0f', floor(NOW / 60000))
  if redis.call('HINCRBY', key, field, n) == n then
    redis.call('PEXPIRE', key, COUNT_TTL, 'NX')
  end
  -- Running totals since the state began (monitoring counters); bounded by the vocabulary.
  redis.call('HINCRBY', BASE .. 'tot', field, n)
end

local function count_delay(prov, delay)
  local bucket = 'inf'
  for _, bound in ipairs(DELAY_BOUNDS) do
    if delay <= bound then
      bucket = tostring(bound)
      break
    end
  end
  count(prov, 'delay', bucket)
  -- The sum (whole ms) makes the buckets a histogram with a mean; an instant admit adds 0.
  if delay >= 1 then count(prov, 'delay', 'sum', floor(delay)) end
end

-- ---------------------------------------------------------------- pressure and breaker

local function pressure_key(prov) return BASE .. 'pr:' .. prov end

local function pressure_event(prov)
  local sv = scope(key_v(prov))
  sv.pl = NOW
  sv._dirty = true
  local key = pressure_key(prov)
  local n = redis.call('RPUSH', key, string.format('%.17g', NOW))
  if n > PRESSURE_CAP then redis.call('LPOP', key) end
  redis.call('PEXPIRE', key, PRESSURE_WINDOW)
end

local function retry_pressure(prov)
  -- No event within the window (the provider's scope keeps the last one's time): no read.
  local last = scope(key_v(prov)).pl
  if last == nil or last <= NOW - PRESSURE_WINDOW then return 0 end
  local key = pressure_key(prov)
  if redis.call('LLEN', key) == 0 then return 0 end
  local horizon = NOW - PRESSURE_WINDOW
  while true do
    local first = redis.call('LINDEX', key, 0)
    if not first or tonumber(first) > horizon then break end
    redis.call('LPOP', key)
  end
  return redis.call('LLEN', key)
end

local function transition(sv, prov, to)
  local from = sv.bs or 'closed'
  sv.bs = to
  if to == 'open' then
    sv.bg = (sv.bg or 0) + 1
    sv.bo = NOW
    sv.bp = 0
  elseif to == 'closed' then
    sv.bf = 0
    sv.bp = 0
  end
  sv._dirty = true
  local record = {providerId = prov, from = from, to = to, atEpochMs = NOW, failures = sv.bf or 0}
  redis.call('LPUSH', TRANS, cjson.encode(record))
  redis.call('LTRIM', TRANS, 0, TRANSITION_HISTORY - 1)
  RESULT_TRANSITIONS[#RESULT_TRANSITIONS + 1] = record
  count(prov, 'transition', from .. '>' .. to)
  return record
end

local function breaker_state(sv)
  return sv.bs or 'closed'
end

-- ------------------------------------------------------------------------ the checks

local function unused_reserved(prov)
  local rsv = limits('rsv')
  if not rsv then return 0 end
  local names = {}
  for pid in pairs(rsv) do
    if prov == nil then names[#names + 1] = key_p(pid) else names[#names + 1] = key_x(prov, pid) end
  end
  load_scopes(names)
  local total = 0
  for pid, reserved in pairs(rsv) do
    local a
    if prov == nil then a = scope(key_p(pid)).a else a = scope(key_x(prov, pid)).a end
    if reserved > a then total = total + reserved - a end
  end
  return total
end

local function budget_field(kind, id) if kind == 'W' then return 'W' end return kind .. enc(id) end

local function budget_reason(b, field, lim, w)
  if not lim then return nil end
  local ma, mc, mt = lim.ma, lim.mc, lim.mt
  if ma == nil and mc == nil and mt == nil then return nil end
  if ma ~= nil and (b[field .. 'a'] or 0) + w.att > ma then return 'attempts' end
  if mc ~= nil and w.cost ~= nil and (b[field .. 'c'] or 0) + w.cost > mc + EPS then return 'cost' end
  if mt ~= nil and w.tok ~= nil and (b[field .. 't'] or 0) + w.tok > mt then return 'tokens' end
  return nil
end

-- Invocation budgets of the three scopes; a failure rejects (never defers).
local function budgets_reason(w, lp, lw, lv)
  if not (lp.budgeted or lw.budgeted or lv.budgeted) then return nil end
  local b = budget(w.bud)
  return budget_reason(b, budget_field('P', w.pid), lp, w)
    or budget_reason(b, 'W', lw, w)
    or budget_reason(b, budget_field('V', w.prov), lv, w)
end

-- Dispatch checks in order; returns 'admit', or 'reject' + reason, or 'defer' + reason
-- + optional wake time + optional token bucket scope to hold. Nothing is consumed here.
local function dispatch_check(w, lp, lw, lv)
  local sp, sw, sv, sx = scopes_of(w.pid, w.prov)
  if sp.a >= lp.c or sw.a >= lw.c or sv.a >= lv.c then return 'defer', 'concurrency' end
  if lw.sh ~= nil and sp.a >= max(1, floor(lw.sh * lw.c)) then return 'defer', 'concurrency' end
  if lv.sh ~= nil and sx.a >= max(1, floor(lv.sh * lv.c)) then return 'defer', 'concurrency' end
  local reserved = lp.rc or 0
  local rsv = limits('rsv')
  if rsv and sp.a >= reserved then
    local unused = unused_reserved(nil)
    if unused > 0 and lw.c - sw.a - unused < 1 then return 'defer', 'concurrency' end
  end
  if rsv and sx.a >= reserved then
    local unused = unused_reserved(w.prov)
    if unused > 0 and lv.c - sv.a - unused < 1 then return 'defer', 'concurrency' end
  end
  if sv.pz ~= nil and sv.pz > NOW then return 'defer', 'retry-after', sv.pz end
  local bk = lv.bk
  if bk ~= nil and sv.bs ~= nil and sv.bs ~= 'closed' then
    if sv.bs == 'open' then
      local reopen = (sv.bo or 0) + bk.om
      if NOW < reopen then return 'defer', 'circuit-open', reopen end
      transition(sv, w.prov, 'half-open')
    end
    if (sv.bp or 0) >= bk.hm then return 'defer', 'circuit-open' end
  end
  local reason = budgets_reason(w, lp, lw, lv)
  if reason then return 'reject', reason end
  -- The request buckets of the principal, the workspace and the provider, then their token
  -- buckets, in that order.
  if lp.rpm ~= nil or lw.rpm ~= nil or lv.rpm ~= nil then
    for i = 1, 3 do
      local s, lim
      if i == 1 then s, lim = sp, lp elseif i == 2 then s, lim = sw, lw else s, lim = sv, lv end
      local rpm = lim.rpm
      if rpm ~= nil then
        local rate = rpm / 60000
        local lvl = refill(s, 'rl', 'rt', rpm, rate)
        if lvl < 1 - EPS then return 'defer', 'requests-per-minute', NOW + (1 - lvl) / rate end
      end
    end
  end
  if lp.tps == nil and lw.tps == nil and lv.tps == nil then return 'admit' end
  local tok = w.tok or 0
  for i = 1, 3 do
    local s, lim
    if i == 1 then s, lim = sp, lp elseif i == 2 then s, lim = sw, lw else s, lim = sv, lv end
    local tps = lim.tps
    if tps ~= nil then
      local need = tok
      if s.h ~= nil and s.h ~= w.id then
        if redis.call('HEXISTS', WAITERS, s.h) == 1 then
          need = need + (s.ht or 0)
        else
          s.h, s.ht = nil, nil -- the holder is gone (its process died or the state moved on)
          s._dirty = true
        end
      end
      local rate = tps / 1000
      local lvl = refill(s, 'tl', 'tt', tps, rate)
      if lvl < need - EPS then
        local wake = nil
        if need <= tps + EPS and rate > 0 then wake = NOW + (need - lvl) / rate end
        return 'defer', 'tokens-per-second', wake, s
      end
    end
  end
  return 'admit'
end

-- Share caps and queue lengths, for a request that must wait.
local function queue_full(w, lp, lw, lv)
  local sp, sw, sv, sx = scopes_of(w.pid, w.prov)
  if lp.ql ~= nil and sp.q >= lp.ql then return true end
  if lw.ql ~= nil and sw.q >= lw.ql then return true end
  if lv.ql ~= nil and sv.q >= lv.ql then return true end
  if lw.sh ~= nil and lw.ql ~= nil and sp.q >= max(1, floor(lw.sh * lw.ql)) then return true end
  if lv.sh ~= nil and lv.ql ~= nil and sx.q >= max(1, floor(lv.sh * lv.ql)) then return true end
  return false
end

-- ------------------------------------------------------------------- leases and waiters

local function evidence(w)
  local nv = key_v(w.prov)
  local sp, sv = scope(key_p(w.pid)), scope(nv)
  local lv = limits(nv)
  local ev = {a = sp.a, q = sp.q, bs = breaker_state(sv), rp = retry_pressure(w.prov), st = nil,
    ep = nil, rel = nil, tr = nil}
  local pause = (sv.pz or 0) - NOW
  if pause > 0 then ev.pz = pause end
  if lv and lv.bk ~= nil and sv.bs == 'open' then
    local left = (sv.bo or 0) + lv.bk.om - NOW
    if left > 0 then ev.op = left end
  end
  return ev
end

local function release_holds(w)
  if w.hold == nil then return end
  for _, key in ipairs(w.hold) do
    local s = scope(key)
    if s.h == w.id then
      s.h, s.ht = nil, nil
      s._dirty = true
    end
  end
  w.hold = nil
end

-- Leases this library wrote, by their text: the call that gives one back (usually the caller's
-- next) finds it without decoding it. What a text holds depends on the text alone; nothing
-- changes a lease taken from here. Emptied when it holds too many.
local WRITTEN_LEASES, WRITTEN_LEASES_COUNT = {}, 0

-- A lease's field in the workspace's state hash (scope fields never begin with L).
local function lease_field(id)
  return 'L' .. id
end

-- What the caller says of a lease it gives back, one argument: success ('1', '0', or '-' for no
-- outcome), then, only when any of them is known, ',' retry-after ms ',' actual tokens ','
-- actual cost (each empty when absent). Returns success (true, false or nil), retry-after,
-- actual tokens, actual cost.
local function outcome(text)
  local first = string.byte(text, 1)
  local success = nil
  if first == 49 then success = true elseif first == 48 then success = false end
  if #text <= 1 then return success end
  local retry_after, actual_tokens, actual_cost = string.match(text, '^.,([^,]*),([^,]*),([^,]*)$')
  return success, tonumber(retry_after), tonumber(actual_tokens), tonumber(actual_cost)
end

-- A lease as JSON (what cjson.encode writes, put together directly), in one concatenation of
-- the long part: a lease is written with every admission, and each `..` apart copies the text
-- made so far (the optional fields, short, are put together first).
local function lease_text(proc, pid, prov, bud, gen, probe, at, tok, cost, bk, off)
  local tail = '}'
  if cost ~= nil or bk ~= nil or off ~= nil then
    tail = ''
    if cost ~= nil then tail = ',"cost":' .. num(cost) end
    if bk ~= nil then tail = tail .. ',"bk":' .. num(bk) end
    if off ~= nil then tail = tail .. ',"off":' .. num(off) end
    tail = tail .. '}'
  end
  if tok ~= nil then tail = ',"tok":' .. (INT_TEXT[tok] or num(tok)) .. tail end
  return '{"proc":' .. (JSON_TEXTS[proc] or json_text(proc)) .. ',"pid":'
    .. (JSON_TEXTS[pid] or json_text(pid)) .. ',"prov":'
    .. (JSON_TEXTS[prov] or json_text(prov)) .. ',"bud":' .. cjson.encode(bud) .. ',"gen":'
    .. (INT_TEXT[gen] or num(gen)) .. ',"probe":' .. (INT_TEXT[probe] or num(probe))
    .. ',"at":' .. num(at) .. tail
end

local function lease_json(l)
  return lease_text(l.proc, l.pid, l.prov, l.bud, l.gen, l.probe, l.at, l.tok, l.cost, l.bk, l.off)
end

-- Leases the common acquire wrote (taken by their process, no breaker probe, no budget), by
-- their text: principal and provider, all a lease given back in the common way needs. What a
-- text holds depends on the text alone. Emptied when they hold too many.
local PLAIN_PIDS, PLAIN_PROVS, PLAIN_COUNT = {}, {}, 0

-- Notes that an invocation is admitted on a provider (P:{ws}:r:<budget>, see the key layout);
-- returns whether it was admitted there before.
local function admitted_before(bud, prov)
  local key, mark = BASE .. 'r:' .. bud, NAMES_R[prov] or key_r(prov)
  local seen = redis.call('GET', key)
  if not seen then
    redis.call('SET', key, mark, 'PX', BUDGET_TTL_TEXT)
    return false
  end
  local pos, n = 1, #seen
  while pos <= n do
    local colon = string.find(seen, ':', pos, true)
    if colon == nil then break end
    local size = tonumber(string.sub(seen, pos, colon - 1)) or 0
    if string.sub(seen, colon + 1, colon + size) == prov then return true end
    pos = colon + size + 1
  end
  redis.call('APPEND', key, mark)
  return false
end

local function admit(w, lp, lw, lv, offered)
  local sp, sw, sv, sx = scopes_of(w.pid, w.prov)
  sp.a = sp.a + 1
  sw.a = sw.a + 1
  sv.a = sv.a + 1
  sx.a = sx.a + 1
  sp._dirty = true sw._dirty = true sv._dirty = true sx._dirty = true
  local tok = w.tok or 0
  local bkey = BASE .. 'b:' .. w.bud
  local budgeted = false
  for i = 1, 3 do
    local kind, id, lim, s
    if i == 1 then kind, id, lim, s = 'P', w.pid, lp, sp
    elseif i == 2 then kind, id, lim, s = 'W', nil, lw, sw
    else kind, id, lim, s = 'V', w.prov, lv, sv end
    if lim.budgeted then
      local f = budget_field(kind, id)
      redis.call('HINCRBY', bkey, f .. 'a', w.att)
      if w.cost ~= nil then redis.call('HINCRBYFLOAT', bkey, f .. 'c', w.cost) end
      redis.call('HINCRBY', bkey, f .. 't', tok)
      if BUD ~= nil then BUD[bkey] = nil end
      budgeted = true
    end
    if lim.rpm ~= nil then consume(s, 'rl', 'rt', lim.rpm, lim.rpm / 60000, 1) end
    if lim.tps ~= nil and tok > 0 then consume(s, 'tl', 'tt', lim.tps, lim.tps / 1000, tok) end
  end
  -- The budget key lives BUDGET_TTL from the invocation's first admission.
  if budgeted then redis.call('PEXPIRE', bkey, BUDGET_TTL_TEXT, 'NX') end
  -- A second admission of one invocation on this provider is a repeat: retry pressure.
  if admitted_before(w.bud, w.prov) then pressure_event(w.prov) end
  release_holds(w)
  local probe = 0
  if lv.bk ~= nil and sv.bs == 'half-open' then
    sv.bp = (sv.bp or 0) + 1
    probe = 1
  end
  local lease = {
    proc = w.proc, pid = w.pid, prov = w.prov, bud = w.bud, tok = w.tok, cost = w.cost,
    gen = sv.bg or 0, probe = probe, at = NOW,
  }
  if lp.budgeted or lw.budgeted or lv.budgeted then lease.bk = 1 end
  if offered then
    -- Granted to a waiter: its process takes it (take) or it lapses back to the pool.
    lease.off = NOW + GRANT_TTL
    redis.call('ZADD', OFFERS, string.format('%.17g', lease.off), w.id)
    -- Marks that grants may be pending, so a release looks at them (see needs_pump).
    sw.ox = 1
    sw._dirty = true
  end
  local text = lease_json(lease)
  redis.call('HSET', STATE, lease_field(w.id), text)
  if not offered then
    if WRITTEN_LEASES_COUNT >= 1024 then WRITTEN_LEASES, WRITTEN_LEASES_COUNT = {}, 0 end
    WRITTEN_LEASES[text] = lease
    WRITTEN_LEASES_COUNT = WRITTEN_LEASES_COUNT + 1
  end
  -- A waiter's process was registered here when it queued; the caller registers on its first
  -- admission here (then its heartbeat renews it, and a reaper finds what it held).
  if w.proc == PROC and not REGISTERED then
    heartbeat()
    REGISTERED = true
  end
  if sv.pz == nil and sv.bs == nil and sv.pl == nil then
    -- No pause, breaker closed, no retry pressure on record: what evidence would find.
    return {a = sp.a, q = sp.q, bs = 'closed', rp = 0, st = nil, ep = nil, rel = nil, tr = nil}
  end
  return evidence(w)
end

local function dequeue(w)
  local lane = lane_of(w.prov, w.pid)
  local qk = lane_key(lane)
  if redis.call('LINDEX', qk, 0) == w.id then
    redis.call('LPOP', qk)
  else
    redis.call('LREM', qk, 1, w.id)
  end
  redis.call('HDEL', WAITERS, w.id)
  local sp, sw, sv, sx = scopes_of(w.pid, w.prov)
  for _, s in ipairs({sp, sw, sv, sx}) do
    s.q = max(0, s.q - 1)
    s._dirty = true
  end
  release_holds(w)
  if redis.call('LLEN', qk) == 0 then redis.call('ZREM', ROT, lane) end
end

local function notify(proc, message)
  local key = BASE .. 'g:' .. proc
  redis.call('RPUSH', key, cjson.encode(message))
  redis.call('PEXPIRE', key, 2 * PROC_TTL)
end

-- Give back what a lease holds. `success` is true, false or nil (no outcome).
-- `gone`, when given, collects the lease fields to delete from the state hash (one HDEL for a
-- batch).
local function free_lease(id, lease, success, retry_after, actual_tokens, actual_cost, gone)
  if gone then
    gone[#gone + 1] = lease_field(id)
  else
    redis.call('HDEL', STATE, lease_field(id))
  end
  if lease.off ~= nil then redis.call('ZREM', OFFERS, id) end
  local sp, sw, sv, sx = scopes_of(lease.pid, lease.prov)
  if sp.a >= 1 then sp.a = sp.a - 1 else sp.a = 0 end
  if sw.a >= 1 then sw.a = sw.a - 1 else sw.a = 0 end
  if sv.a >= 1 then sv.a = sv.a - 1 else sv.a = 0 end
  if sx.a >= 1 then sx.a = sx.a - 1 else sx.a = 0 end
  sp._dirty = true sw._dirty = true sv._dirty = true sx._dirty = true
  if (actual_tokens ~= nil or actual_cost ~= nil) and lease.bk == 1 then
    -- Reconcile the invocation budgets with what the provider really used.
    local key = BASE .. 'b:' .. lease.bud
    local b = budget(lease.bud)
    local set = {}
    for _, f in ipairs({budget_field('P', lease.pid), 'W', budget_field('V', lease.prov)}) do
      if b[f .. 'a'] ~= nil then
        if actual_tokens ~= nil then
          set[#set + 1] = f .. 't'
          set[#set + 1] = string.format('%.17g', max(0, (b[f .. 't'] or 0) + actual_tokens - (lease.tok or 0)))
        end
        if actual_cost ~= nil then
          set[#set + 1] = f .. 'c'
          set[#set + 1] = string.format('%.17g', max(0, (b[f .. 'c'] or 0) + actual_cost - (lease.cost or 0)))
        end
      end
    end
    if #set > 0 then redis.call('HSET', key, unpack(set)) end
    if BUD ~= nil then BUD[key] = nil end
  end
  local lv = limits('V:' .. lease.prov)
  local gen = sv.bg or 0
  if lease.probe == 1 and lease.gen == gen then
    sv.bp = max(0, (sv.bp or 0) - 1)
  end
  if retry_after ~= nil then
    local until_ms = NOW + retry_after
    if until_ms > (sv.pz or 0) then sv.pz = until_ms end
    pressure_event(lease.prov)
  elseif success ~= nil and lv and lv.bk ~= nil and lease.gen == gen then
    if success then
      sv.bf = 0
      if sv.bs == 'half-open' then transition(sv, lease.prov, 'closed') end
    else
      local state = sv.bs or 'closed'
      if state == 'half-open' then
        sv.bf = (sv.bf or 0) + 1
        transition(sv, lease.prov, 'open')
      elseif state == 'closed' then
        sv.bf = (sv.bf or 0) + 1
        if sv.bf >= lv.bk.ft then transition(sv, lease.prov, 'open') end
      end
    end
  end
end

local function drop(w, reason)
  dequeue(w)
  count(w.prov, 'reject', reason)
  local ev = evidence(w)
  ev.t = 'r'
  ev.id = w.id
  ev.ws = WS
  ev.reason = reason
  notify(w.proc, ev)
end

-- ---------------------------------------------------------------------------- the pump

local function next_rotation()
  return redis.call('HINCRBY', META, 'rr', 1)
end

local function rotation_now()
  return tonumber(redis.call('HGET', META, 'rr') or '0')
end

-- Grants not taken in time go back to the pool (their process lost the message, or no longer
-- has the waiter). Returns when the next pending grant lapses, or nil.
local function lapse_grants()
  local sw = scope(key_w())
  if sw.ox == nil then return nil end
  local first = redis.call('ZRANGE', OFFERS, 0, 0, 'WITHSCORES')
  if #first == 0 then
    sw.ox = nil
    sw._dirty = true
    return nil
  end
  if tonumber(first[2]) > NOW then return tonumber(first[2]) end
  local due = redis.call('ZRANGEBYSCORE', OFFERS, '-inf', string.format('%.17g', NOW), 'LIMIT', 0, 256)
  for _, id in ipairs(due) do
    local raw = redis.call('HGET', STATE, lease_field(id))
    if raw then
      local lease = cjson.decode(raw)
      if lease.off ~= nil then free_lease(id, lease, nil, nil, nil, nil) end
    end
    redis.call('ZREM', OFFERS, id)
  end
  first = redis.call('ZRANGE', OFFERS, 0, 0, 'WITHSCORES')
  if #first == 0 then
    sw.ox = nil
    sw._dirty = true
    return nil
  end
  return tonumber(first[2])
end

-- Serve lanes least recently served first, head only, until a whole pass admits nobody.
-- A lane that is served goes to the back; nothing is admitted while the workspace is full.
local function serve()
  local lw = limits('W')
  local wake = nil
  local progressed = true
  while progressed do
    progressed = false
    local sw = scope(key_w())
    if sw.a >= lw.c then break end
    local lanes = redis.call('ZRANGE', ROT, 0, -1)
    local full = {}
    for _, lane in ipairs(lanes) do
      if sw.a >= lw.c then break end
      local prov, pid = split_lane(lane)
      if not full[prov] then
        local qk = lane_key(lane)
        local serving = true
        while serving do
          serving = false
          local wid = redis.call('LINDEX', qk, 0)
          if not wid then
            redis.call('ZREM', ROT, lane)
          else
            local w = waiter(wid)
            local lp, lv = limits('P:' .. pid), limits('V:' .. prov)
            if w == nil then
              redis.call('LPOP', qk)
              serving = true
            elseif (w.exp ~= nil and w.exp <= NOW) or not proc_alive(w.proc) then
              drop(w, w.expr or 'queue-timeout')
              serving = true
            elseif not lp then
              drop(w, 'unconfigured-principal')
              serving = true
            elseif not lv then
              drop(w, 'unconfigured-provider')
              serving = true
            else
              RESULT_TRANSITIONS = {}
              local verdict, reason, at, hold = dispatch_check(w, lp, lw, lv)
              if verdict == 'admit' then
                dequeue(w)
                local ev = admit(w, lp, lw, lv, true)
                ev.t = 'g'
                ev.id = wid
                ev.ttl = GRANT_TTL
                count(prov, 'admit', 'admitted')
                count_delay(prov, NOW - (w.arr or NOW))
                ev.ws = WS
                if #RESULT_TRANSITIONS > 0 then ev.tr = RESULT_TRANSITIONS end
                notify(w.proc, ev)
                if redis.call('LLEN', qk) > 0 then
                  redis.call('ZADD', ROT, next_rotation(), lane)
                end
                progressed = true
              elseif verdict == 'reject' then
                drop(w, reason)
                serving = true
              else
                if hold ~= nil and hold.h == nil then
                  hold.h = wid
                  hold.ht = w.tok or 0
                  hold._dirty = true
                  w.hold = w.hold or {}
                  w.hold[#w.hold + 1] = hold._key
                  redis.call('HSET', WAITERS, wid, cjson.encode(w))
                end
                if at ~= nil and (wake == nil or at < wake) then wake = at end
                if reason == 'concurrency' then
                  local sv = scope(key_v(prov))
                  if sv.a >= lv.c then full[prov] = true end
                end
              end
            end
          end
        end
      end
    end
  end
  return wake
end

-- Lapsed grants back to the pool, then the lanes served. Returns the next time-based wake (a
-- bucket refills, a pause ends, a grant lapses), or nil; the heartbeat pumps due workspaces.
local function pump()
  if not limits('W') then return nil end
  local wake = lapse_grants()
  if EPOCH_READY ~= nil and NOW < EPOCH_READY then
    -- A new epoch's grace: nobody is served before the processes have put back their permits
    -- (a promoted replica may still hold waiters but not every permit); the wake is the end.
    redis.call('HSET', META, 'wk', string.format('%.17g', EPOCH_READY))
    return EPOCH_READY
  end
  if scope(key_w()).q > 0 then
    local at = serve()
    if at ~= nil and (wake == nil or at < wake) then wake = at end
  end
  if wake ~= nil then
    redis.call('HSET', META, 'wk', string.format('%.17g', wake))
  else
    redis.call('HDEL', META, 'wk')
  end
  return wake
end

-- Whether a permit given back may serve someone now: a waiter is queued or a grant is pending.
-- Otherwise a release touches no queue machinery at all.
local function needs_pump()
  local sw = scope(key_w())
  return sw.q > 0 or sw.ox ~= nil
end

-- Give back `n` leases whose arguments start at ARGV[at], four each: lease id, its principal
-- and provider as the caller knows them ('' if it does not; only the common acquire reads them,
-- as a hint of which scopes to read with the leases), the outcome (see `outcome`). Returns one
-- entry per lease: {st = 'released' | 'gone', tr = transitions it caused}. `also_fields` and
-- `also_scopes` (optional) name limits and scopes the caller needs next: they are read with the
-- leases' own, in the same two reads.
local function release_many(at, n, also_fields, also_scopes)
  local out = {}
  if n == 0 then return out end
  if n == 1 then
    -- One lease (the usual case): the same steps without the batch's bookkeeping.
    local id = ARGV[at]
    local raw = redis.call('HGET', STATE, lease_field(id))
    if not raw then
      out[1] = {st = 'gone'}
      return out
    end
    local lease = WRITTEN_LEASES[raw] or cjson.decode(raw)
    local np, nv, nx = key_p(lease.pid), key_v(lease.prov), key_x(lease.prov, lease.pid)
    if also_fields and REV == nil and #also_fields == 4 and #also_scopes == 3 then
      -- An acquire's opening (nothing read yet): the lease's limits and scopes and the
      -- request's own in one read each, kept where nothing was kept yet (as preload and
      -- load_scopes would).
      local f1, f2, f3, f4 = also_fields[1], also_fields[2], also_fields[3], also_fields[4]
      local r = redis.call('HMGET', PROF, 'rev', f1, f2, f3, f4, nv)
      REV = r[1] or false
      if LIM[f1] == nil then LIM[f1] = decode_limits(f1, r[2]) end
      if LIM[f2] == nil then LIM[f2] = decode_limits(f2, r[3]) end
      if LIM[f3] == nil then LIM[f3] = decode_limits(f3, r[4]) end
      if LIM[f4] == nil then LIM[f4] = decode_limits(f4, r[5]) end
      if LIM[nv] == nil then LIM[nv] = decode_limits(nv, r[6]) end
      local s1, s2, s3 = also_scopes[1], also_scopes[2], also_scopes[3]
      r = redis.call('HMGET', STATE, np, nv, nx, 'W', s1, s2, s3)
      if SC[np] == nil then new_scope(np, r[1] or nil) end
      if SC[nv] == nil then new_scope(nv, r[2] or nil) end
      if SC[nx] == nil then new_scope(nx, r[3] or nil) end
      if SC.W == nil then new_scope('W', r[4] or nil) end
      if SC[s1] == nil then new_scope(s1, r[5] or nil) end
      if SC[s2] == nil then new_scope(s2, r[6] or nil) end
      if SC[s3] == nil then new_scope(s3, r[7] or nil) end
    else
      if also_fields then preload(nv, unpack(also_fields)) else preload(nv) end
      if also_scopes then
        load_scopes({np, nv, nx, 'W', also_scopes[1], also_scopes[2], also_scopes[3]})
      else
        load_scopes({np, nv, nx, 'W'})
      end
    end
    local success, retry_after, actual_tokens, actual_cost = outcome(ARGV[at + 3])
    RESULT_TRANSITIONS = {}
    free_lease(id, lease, success, retry_after, actual_tokens, actual_cost)
    local entry = {st = 'released'}
    if #RESULT_TRANSITIONS > 0 then entry.tr = RESULT_TRANSITIONS end
    RESULT_TRANSITIONS = {}
    out[1] = entry
    return out
  end
  local ids, lease_fields = {}, {}
  for i = 0, n - 1 do
    ids[#ids + 1] = ARGV[at + 4 * i]
    lease_fields[#lease_fields + 1] = lease_field(ARGV[at + 4 * i])
  end
  local raws = redis.call('HMGET', STATE, unpack(lease_fields))
  local leases, fields, names, seen = {}, {}, {}, {}
  for _, f in ipairs(also_fields or {}) do
    seen[f] = true
    fields[#fields + 1] = f
  end
  for _, name in ipairs(also_scopes or {}) do names[#names + 1] = name end
  for i = 1, n do
    local raw = raws[i]
    if raw then
      local lease = cjson.decode(raw)
      leases[i] = lease
      local f = 'V:' .. lease.prov
      if not seen[f] then
        seen[f] = true
        fields[#fields + 1] = f
      end
      names[#names + 1] = key_p(lease.pid)
      names[#names + 1] = key_v(lease.prov)
      names[#names + 1] = key_x(lease.prov, lease.pid)
    end
  end
  if #fields > 0 then
    preload(unpack(fields))
    names[#names + 1] = 'W'
    load_scopes(names)
  end
  local gone, done = {}, {}
  for i = 1, n do
    local lease = leases[i]
    if lease == nil or done[ids[i]] then
      out[i] = {st = 'gone'}
    else
      local success, retry_after, actual_tokens, actual_cost = outcome(ARGV[at + 4 * i - 1])
      RESULT_TRANSITIONS = {}
      free_lease(ids[i], lease, success, retry_after, actual_tokens, actual_cost, gone)
      done[ids[i]] = true
      local entry = {st = 'released'}
      if #RESULT_TRANSITIONS > 0 then entry.tr = RESULT_TRANSITIONS end
      RESULT_TRANSITIONS = {}
      out[i] = entry
    end
  end
  if #gone > 0 then redis.call('HDEL', STATE, unpack(gone)) end
  return out
end

-- Every lease of the workspace: a list of id, text, id, text...
local function all_leases()
  local flat = redis.call('HGETALL', STATE)
  local out = {}
  for i = 1, #flat, 2 do
    local name = flat[i]
    if string.byte(name, 1) == 76 then
      out[#out + 1] = string.sub(name, 2)
      out[#out + 1] = flat[i + 1]
    end
  end
  return out
end

-- Everything a dead process held in one workspace goes back; its waiters leave their lanes.
-- Leases kept in the earlier layout (a hash of their own, P:{ws}:L, by a process of a release
-- before this one's) go back the same way.
local function reclaim_in_ws(dead)
  local leases = all_leases()
  for i = 1, #leases, 2 do
    local lease = cjson.decode(leases[i + 1])
    if lease.proc == dead then free_lease(leases[i], lease, nil, nil, nil, nil) end
  end
  local earlier = BASE .. 'L'
  leases = redis.call('HGETALL', earlier)
  for i = 1, #leases, 2 do
    local lease = cjson.decode(leases[i + 1])
    if lease.proc == dead then
      redis.call('HDEL', earlier, leases[i])
      free_lease(leases[i], lease, nil, nil, nil, nil, {})
    end
  end
  local waiters = redis.call('HGETALL', WAITERS)
  for i = 1, #waiters, 2 do
    local w = cjson.decode(waiters[i + 1])
    if w.proc == dead then dequeue(w) end
  end
end

-- Forgets the invocations named from ARGV[at] on (their number, then their budget ids; nothing
-- when the call names none): their budgets and first-admission marks go, in one delete. `base`
-- is the workspace's key prefix.
local function forget_budgets(base, at)
  local text = ARGV[at]
  if text == nil then return end
  local n = SHORT_NUM[text] or stored_num(text)
  if n == nil or n < 1 then return end
  local bud = ARGV[at + 1]
  if n == 1 and bud ~= nil then
    -- (One invocation, the engine's usual case: no table to build.)
    redis.call('DEL', base .. 'b:' .. bud, base .. 'r:' .. bud)
    return
  end
  local keys = {}
  for i = 1, n do
    bud = ARGV[at + i]
    if bud == nil then error('malformed arguments: fewer budget ids than counted') end
    keys[2 * i - 1], keys[2 * i] = base .. 'b:' .. bud, base .. 'r:' .. bud
  end
  redis.call('DEL', unpack(keys))
end

-- Reap processes whose lease in this workspace lapsed (a few per call): what they held here goes
-- back, their waiters leave, and the lanes are served again. Returns how many were reaped.
local function reap()
  local dead = redis.call('ZRANGEBYSCORE', PROCS, '-inf', string.format('%.17g', NOW), 'LIMIT', 0, 4)
  if #dead == 0 then return 0 end
  for _, proc in ipairs(dead) do
    if ALIVE == nil then ALIVE = {} end
    ALIVE[proc] = false
    reclaim_in_ws(proc)
    redis.call('DEL', BASE .. 'g:' .. proc)
    redis.call('ZREM', PROCS, proc)
  end
  pump()
  return #dead
end

local function reply(t)
  flush()
  return cjson.encode(t)
end

-- The answer of a plain admission (`ev` from evidence, with st, ep and optionally rel): the same
-- JSON as `reply` writes, put together directly in the common case (no pause, no breaker
-- timing, no transition), which spares the encoder's general work.
local function reply_admit(ev)
  if ev.pz ~= nil or ev.op ~= nil or ev.tr ~= nil then return reply(ev) end
  local rel = ''
  if ev.rel ~= nil then
    local items = {}
    for i, entry in ipairs(ev.rel) do
      if entry.tr ~= nil then return reply(ev) end
      items[i] = '{"st":"' .. entry.st .. '"}'
    end
    rel = ',"rel":[' .. table.concat(items, ',') .. ']'
  end
  flush()
  return '{"st":"admit","a":' .. num(ev.a) .. ',"q":' .. num(ev.q)
    .. ',"rp":' .. num(ev.rp) .. ',"bs":"' .. ev.bs .. '","ep":' .. json_text(ev.ep)
    .. rel .. '}'
end

-- An acquire's answers carry the epoch and the leases it gave back first (set by acquire).
local ACQ_EPOCH, ACQ_RELEASED

local function answer(t)
  t.ep = ACQ_EPOCH
  if ACQ_RELEASED ~= nil then t.rel = ACQ_RELEASED end
  return reply(t)
end

local function refuse(w, reason)
  local ev = evidence(w)
  ev.st = 'reject'
  ev.reason = reason
  if #RESULT_TRANSITIONS > 0 then ev.tr = RESULT_TRANSITIONS end
  return answer(ev)
end

-- The common opening of a workspace script: the workspace, then its epoch.
-- Returns nil to go on, or a reply that ends the script.
local function open_ws(check_ready)
  use_ws(ARGV[2])
  local epoch, ready = epoch_check()
  if KNOWN_EPOCH ~= '' and KNOWN_EPOCH ~= epoch then
    return reply({st = 'epoch', ep = epoch})
  end
  if check_ready and NOW < ready then
    return reply({st = 'recovering', ep = epoch, wait = ready - NOW})
  end
  return nil, epoch, ready
end

-- ------------------------------------------------------------------ the common acquire

-- Leases given back ahead of an acquire that the common path takes along; more go the general
-- way.
local COMMON_RELEASES = 8

-- The principal and provider of a lease given back in the common way (its stored text, and the
-- text of its outcome): taken by its process, no breaker probe, no retry-after, no budget to
-- reconcile; nil otherwise.
local function plain_lease(raw, said)
  -- (With figures, the outcome's third character is the comma after an empty retry-after.)
  local figures = #said > 1
  if figures and string.byte(said, 3) ~= 44 then return nil end
  local pid = PLAIN_PIDS[raw]
  if pid ~= nil then return pid, PLAIN_PROVS[raw] end
  local lease = WRITTEN_LEASES[raw] or cjson.decode(raw)
  if lease.off ~= nil or lease.probe == 1 then return nil end
  -- No retry-after, so the figures are actual tokens or cost: a budget would reconcile them.
  if lease.bk == 1 and figures then return nil end
  return lease.pid, lease.prov
end

-- Names a lease's scopes that are not the request's in `extra` (name -> false until read) and,
-- when `names` is given, appends those not named yet to it.
local function extra_scopes(extra, names, lpid, lprov, np, nv)
  local lp_, lv_, lx_ = key_p(lpid), key_v(lprov), key_x(lprov, lpid)
  if lp_ == np and lv_ == nv then return extra end
  extra = extra or {}
  if lp_ ~= np and extra[lp_] == nil then
    extra[lp_] = false
    if names then names[#names + 1] = lp_ end
  end
  if lv_ ~= nv and extra[lv_] == nil then
    extra[lv_] = false
    if names then names[#names + 1] = lv_ end
  end
  if extra[lx_] == nil then
    extra[lx_] = false
    if names then names[#names + 1] = lx_ end
  end
  return extra
end

-- Reads into `extra` the scopes it names from `names[from]` on, given their stored values in
-- `r` (the answer of an HMGET of `names`). Returns false when one is not in the common shape.
local function read_extra(extra, names, r, from)
  for i = from, #names do
    local text = r[i] or ''
    local e = {unpack_common(text)}
    if e[1] == false then return false end
    e[7] = text
    extra[names[i]] = e
  end
  return true
end

-- The parsed limits of the profiles in use, by digest (a digest names the limits it covers,
-- wherever they are installed): field name -> limits, false when the profile has none there.
-- Emptied when it holds too many fields.
local PROFILES, PROFILES_COUNT = {}, 0

-- The limits of the workspace, a principal and a provider, and the reserved permits, of the
-- profile in `prof` whose digest is `dg`; read only when not known for that digest yet.
local function profile_limits(prof, dg, np, nv)
  local known = PROFILES[dg]
  if known == nil then
    known = {}
    PROFILES[dg] = known
  end
  local lw, lp, lv, rsv = known.W, known[np], known[nv], known.rsv
  if lw == nil or lp == nil or lv == nil or rsv == nil then
    if PROFILES_COUNT >= 4096 then
      known = {}
      PROFILES, PROFILES_COUNT = {[dg] = known}, 0
    end
    local raw = redis.call('HMGET', prof, 'W', np, nv, 'rsv')
    lw, lp, lv = decode_limits('W', raw[1]), decode_limits(np, raw[2]), decode_limits(nv, raw[3])
    rsv = decode_limits('rsv', raw[4])
    known.W, known[np], known[nv], known.rsv = lw, lp, lv, rsv
    PROFILES_COUNT = PROFILES_COUNT + 4
  end
  return lw, lp, lv, rsv
end

-- A lease's scope other than the request's: its values after one permit is given back.
local function give_back(extra, name)
  local s = extra[name]
  if s[1] >= 1 then s[1] = s[1] - 1 else s[1] = 0 end
end

-- An acquire in the common case, decided on locals: a request sent for the first time, at most
-- COMMON_RELEASES leases given back first, nobody queued and no grant pending in the workspace,
-- every scope it reads holding counts and buckets only, the revision current, no invocation
-- budget, reserved permit, pause, breaker state or retry pressure in the way, and capacity free.
-- It writes what the general path would write and answers the same text. In any other case it
-- returns nil before it writes anything, and the general path decides.
--
-- The request's four scopes are locals (a, q, rl, rt, tl, tt and the stored text of each);
-- another scope of a lease given back is an entry of `extra`: name -> {a, q, rl, rt, tl, tt,
-- text}.
local function common_acquire()
  if ARGV[15] ~= '1' then return nil end
  local nrel = SHORT_NUM[ARGV[16]] or stored_num(ARGV[16])
  if nrel == nil or nrel > COMMON_RELEASES then return nil end
  local k = keyset(ARGV[2])
  -- The epoch, then the profile: its revision, and its limits by its digest.
  local r = redis.call('HMGET', k[2], E_ID, E_READY, E_WAIT, 'rev', 'dg')
  local epoch = r[1]
  if not epoch or r[3] or not r[2] or (KNOWN_EPOCH ~= '' and KNOWN_EPOCH ~= epoch) then
    return nil
  end
  local ready = SHORT_NUM[r[2]] or stored_num(r[2])
  READ_EPOCH_KEY, READ_EPOCH_ID, READ_EPOCH_READY = k[2], epoch, ready
  if NOW < ready then return nil end
  if r[4] ~= ARGV[4] or not r[5] then return nil end
  local dg = r[5]
  local pid, prov = ARGV[6], ARGV[7]
  local np, nv, nx = NAMES_P[pid] or key_p(pid), NAMES_V[prov] or key_v(prov), key_x(prov, pid)
  local lw, lp, lv, rsv = profile_limits(k[2], dg, np, nv)
  if rsv or not lw or not lp or not lv then return nil end
  if lp.budgeted or lw.budgeted or lv.budgeted then return nil end
  -- The scopes (the request's four, and those the caller names for the leases it gives back)
  -- and the leases, in one read; the scopes of a lease that the caller did not name are read
  -- next, once its text says which they are.
  local st = k[8]
  local lids, lpids, lprovs, extra, names = nil, nil, nil, nil, nil
  local lf1, lpid1, lprov1 = nil, nil, nil
  if nrel == 0 then
    r = redis.call('HMGET', st, 'W', np, nv, nx)
  elseif nrel == 1 and ARGV[18] == pid and ARGV[19] == prov then
    -- The caller's own last permit (of the same pair, as it says): one read, no tables. A lease
    -- that says otherwise goes the general way.
    lf1 = lease_field(ARGV[17])
    r = redis.call('HMGET', st, 'W', np, nv, nx, lf1)
    if not r[5] then return nil end
    lpid1, lprov1 = plain_lease(r[5], ARGV[20])
    if lpid1 ~= pid or lprov1 ~= prov then return nil end
  else
    lids, lpids, lprovs = {}, {}, {}
    names = {'W', np, nv, nx}
    for i = 1, nrel do
      local id = ARGV[13 + 4 * i]
      for j = 1, i - 1 do
        if lids[j] == id then return nil end
      end
      lids[i] = id
      names[4 + i] = lease_field(id)
    end
    for i = 1, nrel do
      local hp, hv = ARGV[14 + 4 * i], ARGV[15 + 4 * i]
      if hp ~= '' and hv ~= '' then extra = extra_scopes(extra, names, hp, hv, np, nv) end
    end
    local first_extra = 5 + nrel
    r = redis.call('HMGET', st, unpack(names))
    if not read_extra(extra, names, r, first_extra) then return nil end
    for i = 1, nrel do
      local raw = r[4 + i]
      if not raw then return nil end
      local lpid, lprov = plain_lease(raw, ARGV[16 + 4 * i])
      if lpid == nil then return nil end
      lpids[i], lprovs[i] = lpid, lprov
      extra = extra_scopes(extra, nil, lpid, lprov, np, nv)
    end
    if extra ~= nil then
      local missing = nil
      for name, v in pairs(extra) do
        if v == false then
          missing = missing or {}
          missing[#missing + 1] = name
        end
      end
      if missing ~= nil then
        local got = redis.call('HMGET', st, unpack(missing))
        if not read_extra(extra, missing, got, 1) then return nil end
      end
    end
  end
  local wt, pt, vt, xt = r[1], r[2] or '', r[3] or '', r[4] or ''
  if not wt then return nil end
  local wa, wq, wrl, wrt, wtl, wtt = unpack_common(wt)
  if wa == false or wq > 0 then return nil end
  local pa, pq, prl, prt, ptl, ptt = unpack_common(pt)
  if pa == false then return nil end
  local va, vq, vrl, vrt, vtl, vtt = unpack_common(vt)
  if va == false then return nil end
  local xa, xq, xrl, xrt, xtl, xtt = unpack_common(xt)
  if xa == false then return nil end
  local idle_before = wa == 0
  -- The leases go back (a failure under a breaker goes the general way).
  for i = 1, nrel do
    local lpid, lprov = lpid1, lprov1
    if lpids ~= nil then lpid, lprov = lpids[i], lprovs[i] end
    if string.byte(ARGV[16 + 4 * i], 1) == 48 then
      local lim = lv
      if lprov ~= prov then
        local name = key_v(lprov)
        lim = PROFILES[dg][name]
        if lim == nil then lim = decode_limits(name, redis.call('HGET', k[2], name)) end
      end
      if lim and lim.bk ~= nil then return nil end
    end
    if wa >= 1 then wa = wa - 1 else wa = 0 end
    local name = key_p(lpid)
    if name == np then
      if pa >= 1 then pa = pa - 1 else pa = 0 end
    else
      give_back(extra, name)
    end
    name = key_v(lprov)
    if name == nv then
      if va >= 1 then va = va - 1 else va = 0 end
    else
      give_back(extra, name)
    end
    name = key_x(lprov, lpid)
    if name == nx then
      if xa >= 1 then xa = xa - 1 else xa = 0 end
    else
      give_back(extra, name)
    end
  end
  -- The checks: concurrency and shares, then the request buckets, then the token buckets, each
  -- of the principal, the workspace and the provider.
  if pa >= lp.c or wa >= lw.c or va >= lv.c then return nil end
  if lw.sh ~= nil and pa >= max(1, floor(lw.sh * lw.c)) then return nil end
  if lv.sh ~= nil and xa >= max(1, floor(lv.sh * lv.c)) then return nil end
  -- (Each bucket's level now is kept for the taking.)
  local prpm, wrpm, vrpm = lp.rpm, lw.rpm, lv.rpm
  local pr, wr, vr, pk, wk, vk
  if prpm ~= nil then
    pr = refilled(prl, prt, prpm, prpm / 60000)
    if pr < 1 - EPS then return nil end
  end
  if wrpm ~= nil then
    wr = refilled(wrl, wrt, wrpm, wrpm / 60000)
    if wr < 1 - EPS then return nil end
  end
  if vrpm ~= nil then
    vr = refilled(vrl, vrt, vrpm, vrpm / 60000)
    if vr < 1 - EPS then return nil end
  end
  local tok = tonumber(ARGV[9])
  local need = tok or 0
  local ptps, wtps, vtps = lp.tps, lw.tps, lv.tps
  if ptps ~= nil then
    pk = refilled(ptl, ptt, ptps, ptps / 1000)
    if pk < need - EPS then return nil end
  end
  if wtps ~= nil then
    wk = refilled(wtl, wtt, wtps, wtps / 1000)
    if wk < need - EPS then return nil end
  end
  if vtps ~= nil then
    vk = refilled(vtl, vtt, vtps, vtps / 1000)
    if vk < need - EPS then return nil end
  end
  -- Invocations the caller is done with are forgotten first (the request's own among them, it
  -- is a first admission again).
  local forgets = 17 + 4 * nrel
  if ARGV[forgets] ~= nil then forget_budgets(k[1], forgets) end
  -- Admitted, if this is the invocation's first admission: a repeat, or a second provider, goes
  -- the general way (the mark is written only where there was none).
  if not redis.call('SET', k[1] .. 'r:' .. ARGV[8], NAMES_R[prov] or key_r(prov), 'NX', 'PX',
      BUDGET_TTL_TEXT) then
    return nil
  end
  pa, wa, va, xa = pa + 1, wa + 1, va + 1, xa + 1
  if prpm ~= nil then prl, prt = taken(pr, prpm, 1) end
  if wrpm ~= nil then wrl, wrt = taken(wr, wrpm, 1) end
  if vrpm ~= nil then vrl, vrt = taken(vr, vrpm, 1) end
  if need > 0 then
    if ptps ~= nil then ptl, ptt = taken(pk, ptps, need) end
    if wtps ~= nil then wtl, wtt = taken(wk, wtps, need) end
    if vtps ~= nil then vtl, vtt = taken(vk, vtps, need) end
  end
  local text = lease_text(PROC, pid, prov, ARGV[8], 0, 0, NOW, tok, tonumber(ARGV[10]))
  if PLAIN_COUNT >= 1024 then PLAIN_PIDS, PLAIN_PROVS, PLAIN_COUNT = {}, {}, 0 end
  PLAIN_PIDS[text], PLAIN_PROVS[text] = pid, prov
  PLAIN_COUNT = PLAIN_COUNT + 1
  if ARGV[14] ~= '1' then
    redis.call('ZADD', k[9], string.format('%.17g', NOW + PROC_TTL), PROC)
  end
  -- The lease, and the scopes that changed, in one write; the leases given back, and scopes
  -- back at their defaults, in one delete.
  -- (Room for the four scopes from the start: a table that grows is rebuilt each time.)
  local set, del = {lease_field(ARGV[5]), text, nil, nil, nil, nil, nil, nil, nil, nil}, nil
  if names ~= nil then
    del = {}
    for i = 1, nrel do del[i] = names[4 + i] end
  elseif lf1 ~= nil then
    del = {lf1}
  end
  local packed = pack_common(wa, wq, wrl, wrt, wtl, wtt)
  if packed ~= wt then set[3], set[4] = 'W', packed end
  packed = pack_common(pa, pq, prl, prt, ptl, ptt)
  if packed ~= pt then set[#set + 1], set[#set + 2] = np, packed end
  packed = pack_common(va, vq, vrl, vrt, vtl, vtt)
  if packed ~= vt then set[#set + 1], set[#set + 2] = nv, packed end
  packed = pack_common(xa, xq, xrl, xrt, xtl, xtt)
  if packed ~= xt then set[#set + 1], set[#set + 2] = nx, packed end
  if extra ~= nil then
    for name, s in pairs(extra) do
      packed = pack_common(s[1], s[2], s[3], s[4], s[5], s[6])
      if packed ~= s[7] then
        if packed == '' then
          del = del or {}
          del[#del + 1] = name
        else
          set[#set + 1], set[#set + 2] = name, packed
        end
      end
    end
  end
  if del ~= nil then redis.call('HDEL', st, unpack(del)) end
  redis.call('HSET', st, unpack(set))
  if idle_before then redis.call('PERSIST', st) end
  local rel = ''
  if nrel == 1 then
    rel = ',"rel":[{"st":"released"}]'
  elseif nrel > 1 then
    rel = ',"rel":[{"st":"released"}' .. string.rep(',{"st":"released"}', nrel - 1) .. ']'
  end
  return '{"st":"admit","a":' .. num(pa) .. ',"q":' .. num(pq) .. ',"rp":0,"bs":"closed","ep":'
    .. json_text(epoch) .. rel .. '}'
end
