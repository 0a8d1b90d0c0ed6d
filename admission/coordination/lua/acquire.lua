-- Admit now, queue fairly, or refuse. ARGV from 4: revision, request id, principal, provider,
-- budget id, tokens, cost, attempts, dwell limit (ms), deadline (ms from now), '1' when the
-- caller has this workspace registered for its process already, '1' when this is the first time
-- the caller sends this request id, then the number of leases the caller gives back first and
-- their arguments (four each, as release_many reads them), then, when the caller is done with
-- invocations, their number and their budget ids (forgotten after the leases go back).
--
-- The common case (capacity free, nobody queued) reads the epoch, the profile's three limit
-- fields and the four scope fields, and writes the scope fields, the lease and the invocation's
-- repeat count: no queue, lane, rotation, offer or tombstone is looked at. Decision counts are
-- kept by the caller and reported with its heartbeat.
local common = common_acquire()
if common then return common end
local done, epoch, ready = open_ws(false)
if done then return done end
local released = nil
local nrel = tonumber(ARGV[16]) or 0
local pid, prov = ARGV[6], ARGV[7]
local fields = {'W', key_p(pid), key_v(prov), 'rsv'}
if nrel > 0 then
  -- The leases' limits and scopes are read with this request's own.
  released = release_many(17, nrel, fields, {key_p(pid), key_v(prov), key_x(prov, pid)})
  if needs_pump() then pump() end
end
forget_budgets(BASE, 17 + 4 * nrel)
-- Answers not counted by the caller (nothing was decided for the first time) carry nc.
ACQ_EPOCH, ACQ_RELEASED = epoch, released
if NOW < ready then return answer({st = 'recovering', wait = ready - NOW}) end
REGISTERED = ARGV[14] == '1'
local w = {
  id = ARGV[5], pid = ARGV[6], prov = ARGV[7], bud = ARGV[8], proc = PROC,
  tok = tonumber(ARGV[9]), cost = tonumber(ARGV[10]), att = tonumber(ARGV[11]), arr = NOW,
}
if ARGV[15] ~= '1' then
  -- A call repeated after a lost connection must not take a second permit or place; a waiter
  -- queued again finds the grant made for it meanwhile, and takes it.
  local held = redis.call('HGET', STATE, lease_field(w.id))
  if held then
    local lease = cjson.decode(held)
    if lease.off ~= nil then
      lease.off = nil
      redis.call('HSET', STATE, lease_field(w.id), cjson.encode(lease))
      redis.call('ZREM', OFFERS, w.id)
    end
    local ev = evidence({pid = lease.pid, prov = lease.prov})
    ev.st = 'admit'
    ev.nc = 1
    return answer(ev)
  end
  if redis.call('HEXISTS', WAITERS, w.id) == 1 then
    local ev = evidence(w)
    ev.st = 'queued'
    ev.nc = 1
    return answer(ev)
  end
end
local sp, sw, sv, sx = scopes_of(w.pid, w.prov)
-- The caller withdrew this request already (its answer was lost): a late copy takes nothing.
-- Looked for only while a tombstone may live (the workspace keeps when the last one lapses), or
-- when the workspace's state is empty (it expired idle, and that time with it).
if ((sw.tb ~= nil and sw.tb > NOW) or sw._raw == '')
    and redis.call('EXISTS', BASE .. 't:' .. w.id) == 1 then
  return answer({st = 'reject', reason = 'cancelled', nc = 1})
end
local rev = REV
if rev == nil or LIM.W == nil or LIM.rsv == nil or LIM[fields[2]] == nil
    or LIM[fields[3]] == nil then
  -- (Read already when a lease given back had the same scopes.)
  rev = preload(unpack(fields))
end
if not rev then return answer({st = 'noprofile'}) end
if rev ~= ARGV[4] then
  return answer({st = 'stale', rev = rev, seq = tonumber(redis.call('HGET', PROF, 'pseq'))})
end
local lp, lw, lv = limits(fields[2]), limits('W'), limits(fields[3])
if not lp then return answer({st = 'reject', reason = 'unconfigured-principal', nc = 1}) end
if not lv then return answer({st = 'reject', reason = 'unconfigured-provider', nc = 1}) end
local reason = budgets_reason(w, lp, lw, lv)
if reason then return refuse(w, reason) end
local verdict, at, hold
verdict = 'defer'
local lane, qk
-- Nobody queued in the workspace: no lane to look at.
if sw.q > 0 then
  lane = lane_of(w.prov, w.pid)
  qk = lane_key(lane)
end
if sw.q == 0 or redis.call('LLEN', qk) == 0 then
  verdict, reason, at, hold = dispatch_check(w, lp, lw, lv)
  if verdict == 'admit' then
    local ev = admit(w, lp, lw, lv)
    ev.st = 'admit'
    if #RESULT_TRANSITIONS > 0 then ev.tr = RESULT_TRANSITIONS end
    ev.ep = epoch
    ev.rel = released
    return reply_admit(ev)
  end
  if verdict == 'reject' then return refuse(w, reason) end
end
if queue_full(w, lp, lw, lv) then return refuse(w, 'queue-full') end
if lane == nil then
  lane = lane_of(w.prov, w.pid)
  qk = lane_key(lane)
end
-- Queued: it expires at its own deadline or dwell limit, whichever comes first.
local dwell, deadline = tonumber(ARGV[12]), tonumber(ARGV[13])
if deadline ~= nil and (dwell == nil or deadline <= dwell) then
  w.exp, w.expr = NOW + deadline, 'deadline-exceeded'
elseif dwell ~= nil then
  w.exp, w.expr = NOW + dwell, 'queue-timeout'
end
if hold ~= nil and hold.h == nil then
  hold.h = w.id
  hold.ht = w.tok or 0
  hold._dirty = true
  w.hold = {hold._key}
end
redis.call('HSET', WAITERS, w.id, cjson.encode(w))
redis.call('RPUSH', qk, w.id)
if redis.call('ZSCORE', ROT, lane) == false then
  -- A new lane joins the rotation just ahead of the lane served last.
  redis.call('ZADD', ROT, rotation_now() - 0.5, lane)
end
for _, s in ipairs({sp, sw, sv, sx}) do
  s.q = s.q + 1
  s._dirty = true
end
if not REGISTERED then heartbeat() end
if at ~= nil then
  local known = redis.call('HGET', META, 'wk')
  if known == false or tonumber(known) > at then
    redis.call('HSET', META, 'wk', string.format('%.17g', at))
  end
end
local ev = evidence(w)
ev.q = ev.q - 1
ev.st = 'queued'
ev.reason = reason
if at ~= nil then ev.wake = at - NOW end
if #RESULT_TRANSITIONS > 0 then ev.tr = RESULT_TRANSITIONS end
return answer(ev)
