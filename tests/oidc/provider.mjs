// A real OpenID Provider for the sign-in tests: panva's oidc-provider with its development
// login form (any password), one client, and each person's claims read from a JSON file at
// every request, so a test can change someone's groups between sign-ins.
//
//   OIDC_PORT=9000 OIDC_REDIRECT_URI=http://127.0.0.1:8000/auth/callback \
//   OIDC_ACCOUNTS=/tmp/accounts.json node tests/oidc/provider.mjs
//
// accounts.json: {"ann": {"groups": ["staff"], "email": "ann@example.com", "name": "Ann"}}
// A login not in the file signs in with no groups. Prints "ready <issuer>" once listening.
import fs from "node:fs";
import Provider from "oidc-provider";

const port = Number(process.env.OIDC_PORT);
const issuer = `http://127.0.0.1:${port}`;
const accountsFile = process.env.OIDC_ACCOUNTS;

function person(id) {
  const all = JSON.parse(fs.readFileSync(accountsFile, "utf8"));
  return all[id] || {};
}

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: process.env.OIDC_CLIENT_ID || "chatbox",
      client_secret: process.env.OIDC_CLIENT_SECRET || "chatbox-test-secret",
      redirect_uris: [process.env.OIDC_REDIRECT_URI],
      grant_types: ["authorization_code"],
      response_types: ["code"],
      token_endpoint_auth_method: "client_secret_basic",
    },
  ],
  async findAccount(ctx, id) {
    return {
      accountId: id,
      async claims() {
        const p = person(id);
        return {
          sub: id,
          email: p.email || `${id}@example.com`,
          email_verified: true,
          name: p.name || id,
          preferred_username: id,
          groups: p.groups || [],
        };
      },
    };
  },
  claims: {
    openid: ["sub", "groups"],
    email: ["email", "email_verified"],
    profile: ["name", "preferred_username"],
  },
  conformIdTokenClaims: false, // the ID token carries the scopes' claims, as most providers'
  features: { devInteractions: { enabled: true } },
  // No consent page for this first-party client: its grant is made on the spot.
  async loadExistingGrant(ctx) {
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope("openid email profile");
    await grant.save();
    return grant;
  },
  ttl: { IdToken: Number(process.env.OIDC_ID_TOKEN_TTL || 3600) },
  cookies: { keys: ["oidc-test-cookie-key"] },
});

const server = provider.listen(port, "127.0.0.1", () => {
  console.log(`ready ${issuer}`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
