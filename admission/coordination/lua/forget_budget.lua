-- Forget exactly one invocation's budgets and repeat counts. ARGV from 9: budget id.
local done, epoch = open_ws(false)
if done then return done end
redis.call('DEL', BASE .. 'b:' .. ARGV[9])
return reply({st = 'ok', ep = epoch})
