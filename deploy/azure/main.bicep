// azqueue on Azure in one deployment: a storage account, a user-assigned managed identity
// with the three data roles azqueue needs on it (and AcrPull on the registry its image is
// in), a Container Apps environment and the `azqueue serve` app signed in as that identity
// (no account key anywhere: pollTaskUrls answers 503, workers use claimWork). With
// aksOidcIssuerUrl the identity is also federated with the azqueue ServiceAccount of an
// AKS cluster, for deploy/kubernetes/overlays/workload-identity.
//
//   az deployment group create --resource-group RG --template-file deploy/azure/main.bicep \
//     --parameters registryName=REGISTRY rootUrl=https://queue.example.com \
//       tipSecrets=$(openssl rand -hex 32) rootAccessToken=$(openssl rand -hex 32) \
//       amqpUrl=amqps://user:password@host/vhost
//
// See docs/operating/container-apps.md. The app's settings are those of
// deploy/container-apps/server.yaml (tests/ops/test_deploy_azure.py holds both against
// the code).

@description('Where everything goes.')
param location string = resourceGroup().location

@description('The storage account\'s name (3-24 lowercase letters and digits, unique in Azure).')
param storageAccountName string = 'azq${uniqueString(resourceGroup().id)}'

@description('The prefix of azqueue\'s tables, queues and containers (AZQUEUE_STORAGE_PREFIX).')
param storagePrefix string = 'azq'

@description('An Azure Container Registry of this resource group holding the azqueue image (scripts/image).')
param registryName string

@description('The image\'s tag: the release (azqueue --version).')
param imageTag string = '1.0.0'

@description('The public rootUrl clients reach the app at (AZQUEUE_ROOT_URL).')
param rootUrl string

@secure()
@description('AZQUEUE_TIP_SECRETS: a long random secret (newest first, comma-separated).')
param tipSecrets string

@secure()
@description('AZQUEUE_ROOT_ACCESS_TOKEN: the root client\'s access token.')
param rootAccessToken string

@secure()
@description('AZQUEUE_AMQP_URL (empty: events off).')
param amqpUrl string = ''

@description('An AKS cluster\'s OIDC issuer URL, to federate the identity with its azqueue ServiceAccount (empty: none).')
param aksOidcIssuerUrl string = ''

@description('The Kubernetes namespace of that ServiceAccount.')
param aksNamespace string = 'azqueue'

// The built-in roles' ids: the three docs/operating/azure-storage.md names, and AcrPull.
var roles = {
  table: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3' // Storage Table Data Contributor
  queue: '974c5e8b-45b9-4653-ba55-5f855dd0fb88' // Storage Queue Data Contributor
  blob: 'ba92f5b4-2d11-453d-a403-e96b0029c9fe' // Storage Blob Data Contributor
  acrPull: '7f951dda-4ed3-4680-a7ca-43fe172d538d' // AcrPull
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: storageAccountName
  location: location
  kind: 'StorageV2'
  sku: { name: 'Standard_LRS' }
  properties: {
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    supportsHttpsTrafficOnly: true
  }
}

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: 'azqueue'
  location: location
}

resource storageRoles 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for role in [roles.table, roles.queue, roles.blob]: {
  name: guid(storage.id, identity.id, role)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', role)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}]

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' existing = {
  name: registryName
}

resource pull 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(registry.id, identity.id, roles.acrPull)
  scope: registry
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roles.acrPull)
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
  }
}

resource federation 'Microsoft.ManagedIdentity/userAssignedIdentities/federatedIdentityCredentials@2023-01-31' = if (!empty(aksOidcIssuerUrl)) {
  parent: identity
  name: 'aks-azqueue'
  properties: {
    issuer: aksOidcIssuerUrl
    subject: 'system:serviceaccount:${aksNamespace}:azqueue'
    audiences: ['api://AzureADTokenExchange']
  }
}

resource logs 'Microsoft.OperationalInsights/workspaces@2022-10-01' = {
  name: 'azqueue-logs'
  location: location
  properties: {
    sku: { name: 'PerGB2018' }
    retentionInDays: 30
  }
}

resource environment 'Microsoft.App/managedEnvironments@2024-03-01' = {
  name: 'azqueue'
  location: location
  properties: {
    appLogsConfiguration: {
      destination: 'log-analytics'
      logAnalyticsConfiguration: {
        customerId: logs.properties.customerId
        sharedKey: logs.listKeys().primarySharedKey
      }
    }
  }
}

var probe = {
  path: '/__lbheartbeat__'
  port: 8080
}

resource app 'Microsoft.App/containerApps@2024-03-01' = {
  name: 'azqueue'
  location: location
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: { '${identity.id}': {} }
  }
  dependsOn: [storageRoles, pull]
  properties: {
    environmentId: environment.id
    configuration: {
      activeRevisionsMode: 'Single'
      ingress: {
        external: true
        targetPort: 8080
        transport: 'http'
        allowInsecure: false
      }
      registries: [{ server: registry.properties.loginServer, identity: identity.id }]
      secrets: concat([
        { name: 'tip-secrets', value: tipSecrets }
        { name: 'root-access-token', value: rootAccessToken }
      ], empty(amqpUrl) ? [] : [{ name: 'amqp-url', value: amqpUrl }])
    }
    template: {
      containers: [
        {
          name: 'azqueue'
          image: '${registry.properties.loginServer}/azqueue:${imageTag}'
          command: ['azqueue', 'serve']
          resources: { cpu: json('0.5'), memory: '1Gi' }
          env: concat([
            { name: 'AZQUEUE_HOST', value: '0.0.0.0' }
            { name: 'AZQUEUE_PORT', value: '8080' }
            { name: 'AZQUEUE_ROOT_URL', value: rootUrl }
            { name: 'AZQUEUE_STORAGE_ACCOUNT_URL', value: storage.properties.primaryEndpoints.blob }
            { name: 'AZQUEUE_STORAGE_PREFIX', value: storagePrefix }
            { name: 'AZURE_CLIENT_ID', value: identity.properties.clientId }
            { name: 'AZQUEUE_TIP_SECRETS', secretRef: 'tip-secrets' }
            { name: 'AZQUEUE_ROOT_CLIENT_ID', value: 'root' }
            { name: 'AZQUEUE_ROOT_ACCESS_TOKEN', secretRef: 'root-access-token' }
            { name: 'AZQUEUE_STORAGE_WAIT', value: '120' }
            { name: 'AZQUEUE_LOG_FORMAT', value: 'json' }
          ], empty(amqpUrl) ? [] : [{ name: 'AZQUEUE_AMQP_URL', secretRef: 'amqp-url' }])
          probes: [
            { type: 'Startup', httpGet: probe, periodSeconds: 2, failureThreshold: 75 }
            { type: 'Readiness', httpGet: probe, periodSeconds: 5 }
            { type: 'Liveness', httpGet: probe, periodSeconds: 10, failureThreshold: 6 }
          ]
        }
      ]
      scale: {
        minReplicas: 2
        maxReplicas: 10
        rules: [{ name: 'requests', http: { metadata: { concurrentRequests: '400' } } }]
      }
    }
  }
}

output rootUrl string = rootUrl
output appFqdn string = app.properties.configuration.ingress.fqdn
output storageAccount string = storage.name
output identityClientId string = identity.properties.clientId
