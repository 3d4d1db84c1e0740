// Answers, for each line of standard input, what Taskcluster's own scope library says:
// a line is a JSON [held scopes, expression], the answer a JSON [valid, satisfied] line
// (satisfied is null where the expression is not a valid one).
const readline = require('readline');
const scopes = require('taskcluster-lib-scopes');

const lines = readline.createInterface({ input: process.stdin });
lines.on('line', line => {
  const [held, expression] = JSON.parse(line);
  let valid = true;
  try {
    scopes.validExpression(expression);
  } catch {
    valid = false;
  }
  const satisfied = valid ? scopes.satisfiesExpression(held, expression) : null;
  process.stdout.write(JSON.stringify([held.every(scopes.validScope) && valid, satisfied]) + '\n');
});
