#!/bin/sh
# The secured cluster's secrets (docker/compose.secure.yaml), made once and kept on later runs:
# a CA, a PKCS12 key store per broker, random passwords, the brokers' JAAS file, and two client
# configs: admin.properties (Java names; the setup job's topics and ACLs) and tandem.properties
# (librdkafka names; the workers' --client-config, see docs/operations.md "Secured clusters").
#
#   SECRETS_DIR/broker  brokers and the setup job: key stores, CA key, JAAS, admin.properties
#   SECRETS_DIR/tandem  workers: the CA certificate and tandem.properties, nothing else
#
# Needs only sh and openssl (the python:3.11-slim image has both).
set -eu
SECRETS_DIR=${SECRETS_DIR:-/secrets}
BROKERS=${BROKERS:-"kafka-1 kafka-2 kafka-3"}
BROKER_UID=${BROKER_UID:-1000}  # the apache/kafka image runs as appuser (uid 1000)
B="$SECRETS_DIR/broker"
T="$SECRETS_DIR/tandem"
if [ -f "$B/.complete" ]; then
  echo "secrets already made in $SECRETS_DIR"
  exit 0
fi
umask 077
mkdir -p "$B" "$T"
password() { openssl rand -hex 16; }
STORE=$(password)
ADMIN=$(password)
TANDEM=$(password)

openssl req -x509 -newkey rsa:3072 -nodes -keyout "$B/ca.key" -out "$B/ca.pem" -days 825 \
  -subj "/CN=Tandem compose CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
for host in $BROKERS; do
  openssl req -newkey rsa:3072 -nodes -keyout "$B/$host.key" -out "$B/$host.csr" -subj "/CN=$host" 2>/dev/null
  printf 'subjectAltName=DNS:%s,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' "$host" > "$B/$host.ext"
  openssl x509 -req -in "$B/$host.csr" -CA "$B/ca.pem" -CAkey "$B/ca.key" -CAcreateserial -days 825 \
    -out "$B/$host.pem" -extfile "$B/$host.ext" 2>/dev/null
  # Java reads PKCS12; the key's password is the store's (Java requires them equal).
  openssl pkcs12 -export -in "$B/$host.pem" -inkey "$B/$host.key" -certfile "$B/ca.pem" -name "$host" \
    -out "$B/$host.p12" -passout "pass:$STORE"
  rm "$B/$host.key" "$B/$host.csr" "$B/$host.ext"
done
# Nothing signs again: a new cluster makes new secrets (docker compose down -v).
rm "$B/ca.key" "$B/ca.srl"
printf '%s' "$STORE" > "$B/keystore_creds"
printf '%s' "$STORE" > "$B/key_creds"

# PLAIN users of every SASL_SSL listener; the brokers log in to each other as admin.
cat > "$B/broker_jaas.conf" <<JAAS
KafkaServer {
  org.apache.kafka.common.security.plain.PlainLoginModule required
  username="admin" password="$ADMIN"
  user_admin="$ADMIN"
  user_tandem="$TANDEM";
};
JAAS

cat > "$B/admin.properties" <<PROPS
security.protocol=SASL_SSL
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$ADMIN";
ssl.truststore.type=PEM
ssl.truststore.location=/etc/kafka/secrets/ca.pem
PROPS

cp "$B/ca.pem" "$T/ca.pem"
cat > "$T/tandem.properties" <<PROPS
# The workers' Kafka connection (TANDEM_CLIENT_CONFIG); the user may not create topics.
security.protocol=SASL_SSL
sasl.mechanism=PLAIN
sasl.username=tandem
sasl.password=$TANDEM
ssl.ca.location=/etc/tandem/secrets/ca.pem
PROPS

chown -R "$BROKER_UID:$BROKER_UID" "$B" 2>/dev/null || echo "warning: could not give $B to uid $BROKER_UID"
touch "$B/.complete"
echo "secrets made in $SECRETS_DIR"
