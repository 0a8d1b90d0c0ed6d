-- What the deployment holds for one workspace, for operators and snapshots. ARGV from 4:
-- principal id ('' for none), minutes of counts to return.
local done, epoch = open_ws(false)
if done then return done end
local out = {st = 'ok', ep = epoch, rev = redis.call('HGET', PROF, 'rev') or cjson.null}
local sw = scope(key_w())
out.workspace = {a = sw.a, q = sw.q, limits = limits('W') or cjson.null}
out.providers = {}
local principals = 0
for _, field in ipairs(redis.call('HKEYS', PROF)) do
  local kind, id = string.sub(field, 1, 2), string.sub(field, 3)
  if kind == 'V:' then
    local sv = scope(key_v(id))
    local lv = limits(field)
    local entry = {a = sv.a, q = sv.q, limits = lv, breaker = breaker_state(sv),
      failures = sv.bf or 0, pause = max(0, (sv.pz or 0) - NOW)}
    if lv.bk ~= nil and sv.bs == 'open' then entry.reopen = max(0, (sv.bo or 0) + lv.bk.om - NOW) end
    out.providers[id] = entry
  elseif kind == 'P:' then
    principals = principals + 1
  end
end
out.principals = principals
out.leases = #all_leases() / 2
out.waiters = redis.call('HLEN', WAITERS)
out.offers = redis.call('ZCARD', OFFERS)
out.lanes = redis.call('ZCARD', ROT)
out.transitions = redis.call('LRANGE', TRANS, 0, -1)
if ARGV[4] ~= '' then
  local sp = scope(key_p(ARGV[4]))
  out.principal = {a = sp.a, q = sp.q}
end
local minutes = tonumber(ARGV[5]) or 0
out.counts = {}
local this = floor(NOW / 60000)
for m = this - minutes + 1, this do
  if minutes > 0 then
    local flat = redis.call('HGETALL', BASE .. 'ct:' .. string.format('%.0f', m))
    if #flat > 0 then
      local c = {}
      for i = 1, #flat, 2 do c[flat[i]] = tonumber(flat[i + 1]) end
      out.counts[string.format('%.0f', m * 60000)] = c
    end
  end
end
local totals = {}
local flat = redis.call('HGETALL', BASE .. 'tot')
for i = 1, #flat, 2 do totals[flat[i]] = tonumber(flat[i + 1]) end
out.totals = totals
out.now = NOW
return reply(out)
